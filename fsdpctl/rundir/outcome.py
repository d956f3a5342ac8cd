"""How a run stands, decided once from its nodes: its state, its exit code and the failure behind the others.

Every backend learns of its nodes its own way (a node agent's word, an exit file, a scheduler); what
that means for the run is decided here alone, so a rank that exited 3 makes the run exit 3 whichever
backend ran it, whatever the order its nodes' news arrived in, and however loaded the machine was.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from .state import Failure, NodeState, RunState

HANG_EXIT = 124
"""The exit code of a run the hang watchdog ended (as timeout(1)'s)."""
NODE_LOST_EXIT = 255
"""The exit code of a run whose node stopped answering (as ssh's own, for a lost connection)."""
_LIVE = (NodeState.STARTING, NodeState.PENDING, NodeState.RUNNING)
_FAILED = (NodeState.FAILED, NodeState.LOST, NodeState.GONE)
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGKILL)


@dataclass(frozen=True, kw_only=True)
class NodeEnd:
    """What is known of one node's part of the run."""

    node_rank: int
    host: str
    state: NodeState
    exit_code: Optional[int] = None
    failure: Optional[Failure] = None
    """What its own last lines say of its failure (torchrun's summary: the rank, its exit code)."""
    stopped: bool = False
    """fsdpctl ended it because another node had failed."""


@dataclass(frozen=True)
class Settled:
    """The run's state, its exit code (None while it is live) and its first failure."""

    state: RunState
    exit_code: Optional[int]
    first_failure: Optional[Failure]


def _failure_of(node: NodeEnd) -> Failure:
    if node.failure is not None:
        return node.failure
    code = node.exit_code if node.exit_code else NODE_LOST_EXIT if node.state is not NodeState.FAILED else 1
    return Failure(kind="lost" if node.state is NodeState.LOST else "exit", host=node.host,
                   node_rank=node.node_rank, exit_code=code)


def _blame(node: NodeEnd) -> tuple:
    """What makes a node's failure the cause of the others, strongest first: a node that vanished
    (its peers only failed because it did), unless fsdpctl was ending it already for another node's
    failure (its link closing on the way out is the stop's doing); one not ended by fsdpctl's own stop
    (a rank there killed by our TERM, or a torchrun that says nothing of a rank, is the stop's doing);
    a rank that failed on its own (torchrun names it, and its last lines do not say a peer went away),
    then one that only lost a peer, then a node that names no rank (its torchrun failed, its
    rendezvous store gone);
    then torchrun's failure time; then the lowest node rank. Time alone misleads: under load a rank
    killed by a signal is stamped when torchrun's monitor notices, after its peers' "connection
    reset" (seen a second later), and a node's news arrives in any order."""
    failure = _failure_of(node)
    by_stop = node.stopped and (failure.rank is None or failure.signal in _STOP_SIGNALS)
    return (failure.kind != "lost" or node.stopped, by_stop, failure.rank is None, failure.peer_gone,
            failure.failed_at or "9999", node.node_rank)


def root_cause(nodes: Sequence[NodeEnd]) -> Optional[Failure]:
    """The failure that caused the others, among the nodes that failed (None: none did)."""
    failed = [n for n in nodes if n.state in _FAILED]
    return _failure_of(min(failed, key=_blame)) if failed else None


def settle(nodes: Sequence[NodeEnd], *, interrupted_by: Optional[int] = None,
           hang: Optional[Failure] = None) -> Settled:
    """The run's state from its nodes': a hang the watchdog ended (124), a launcher interrupted by a
    signal (128+N), a live run while a node is, the root cause's exit code once one failed, else success."""
    if hang is not None and interrupted_by is None:
        if hang.kind == "resize":  # fsdpctl stopped it at a checkpoint to start it on more nodes
            return Settled(RunState.STOPPED, 0, hang)
        return Settled(RunState.FAILED, HANG_EXIT, hang)
    if interrupted_by is not None:  # how the nodes fsdpctl stopped ended is its own doing, not a failure
        return Settled(RunState.INTERRUPTED, 128 + interrupted_by, root_cause([n for n in nodes if not n.stopped]))
    first = root_cause(nodes)
    if any(n.state in _LIVE for n in nodes):
        return Settled(RunState.RUNNING, None, first)
    if first is not None:
        return Settled(RunState.FAILED, first.exit_code, first)
    if any(n.state is not NodeState.SUCCEEDED for n in nodes):  # stopped, or nobody can tell
        return Settled(RunState.UNKNOWN, None, None)
    return Settled(RunState.SUCCEEDED, 0, None)
