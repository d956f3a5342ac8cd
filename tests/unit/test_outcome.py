"""How a run stands, decided once from its nodes: the state, the exit code, and which failure caused
the others, whatever order the nodes' news arrived in."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from fsdpctl.rundir.outcome import HANG_EXIT, NodeEnd, root_cause, settle
from fsdpctl.rundir.state import Failure, NodeState, RunState


def failure(node_rank, failed_at=None, peer_gone=False, exit_code=1, kind="exit", rank=None, signal=None):
    return Failure(kind=kind, host=f"n{node_rank}", node_rank=node_rank, failed_at=failed_at, peer_gone=peer_gone,
                   exit_code=exit_code, rank=rank, signal=signal)


def ended(f: Failure, state=NodeState.FAILED, stopped=False) -> NodeEnd:
    return NodeEnd(node_rank=f.node_rank, host=f.host, state=state, exit_code=f.exit_code, failure=f,
                   stopped=stopped)


def test_the_root_cause_is_a_failure_of_its_own_not_a_lost_peer():
    victim = ended(failure(0, "2026-11-21_13:05:01", peer_gone=True))
    killed = ended(failure(1, "2026-11-21_13:05:01", exit_code=137))
    later = ended(failure(2, "2026-11-21_13:05:07", exit_code=143))
    assert root_cause([victim, killed, later]) is killed.failure
    # torchrun may stamp the killed worker after its victim's exception: a lost peer still loses.
    earlier_victim = ended(replace(victim.failure, failed_at="2026-11-21_13:05:00"))
    assert root_cause([earlier_victim, killed]) is killed.failure
    both_lost = ended(replace(killed.failure, peer_gone=True))  # e.g. the network between them failed
    assert root_cause([both_lost, earlier_victim]) is earlier_victim.failure
    assert root_cause([later, ended(failure(3))]) is later.failure
    # A node that stopped answering is the cause: its peers only failed because it vanished under them.
    vanished = ended(failure(3, "2026-11-21_13:05:09", exit_code=255, kind="lost"), state=NodeState.LOST)
    assert root_cause([killed, vanished]) is vanished.failure
    # ...unless fsdpctl was ending it already: node 0's rendezvous timed out waiting for node 1, still in
    # its setup lines, whose link then closed on its way out. The timeout is the cause.
    timed_out = ended(failure(0, exit_code=1))
    stopped_on_its_way_out = ended(failure(1, exit_code=255, kind="lost"), state=NodeState.LOST, stopped=True)
    assert root_cause([stopped_on_its_way_out, timed_out]) is timed_out.failure


def test_a_named_rank_that_failed_beats_a_node_whose_torchrun_names_none():
    """The CI case: node 0's rank exited 3 behind a flood; node 1 was stopped by fsdpctl and its
    torchrun (or its rank, by our TERM) exited too. Whatever arrived first, the run exits 3."""
    own = ended(failure(0, "2026-11-24_10:15:00", exit_code=3, rank=0))
    stopped_torchrun = ended(failure(1, "2026-11-24_10:14:59", exit_code=1), stopped=True)
    stopped_rank = ended(failure(1, "2026-11-24_10:14:59", exit_code=143, rank=1, signal=15), stopped=True)
    store_gone = ended(failure(1, "2026-11-24_10:14:58", exit_code=1))  # its agent lost the rendezvous store
    for others in ([stopped_torchrun], [stopped_rank], [store_gone], [stopped_rank, store_gone]):
        for order in itertools.permutations([own, *others]):
            assert root_cause(list(order)) is own.failure
            assert settle(list(order)).exit_code == 3


def test_a_rank_that_failed_on_its_own_on_a_node_we_stopped_is_still_the_cause():
    """The first node seen failing may only have lost a peer; the node fsdpctl then stopped had a
    rank that failed first (its exit code is not our signal's)."""
    victim = ended(failure(0, "2026-11-24_10:15:00", peer_gone=True, rank=0))
    cause = ended(failure(1, "2026-11-24_10:15:01", exit_code=3, rank=1), stopped=True)
    assert root_cause([victim, cause]) is cause.failure


def test_ties_are_broken_the_same_way_every_time():
    a, b = ended(failure(0, "t", exit_code=3, rank=0)), ended(failure(1, "t", exit_code=4, rank=1))
    assert root_cause([b, a]) is root_cause([a, b]) is a.failure


@pytest.mark.parametrize(("states", "kwargs", "expected"), [
    ((NodeState.SUCCEEDED, NodeState.SUCCEEDED), {}, (RunState.SUCCEEDED, 0)),
    ((NodeState.RUNNING, NodeState.SUCCEEDED), {}, (RunState.RUNNING, None)),
    ((NodeState.FAILED, NodeState.SUCCEEDED), {}, (RunState.FAILED, 7)),
    ((NodeState.FAILED, NodeState.RUNNING), {}, (RunState.RUNNING, None)),
    ((NodeState.FAILED, NodeState.FAILED), {"interrupted_by": 2}, (RunState.INTERRUPTED, 130)),
    ((NodeState.FAILED, NodeState.FAILED), {"hang": Failure(kind="hang", host=None, node_rank=None,
                                                             exit_code=HANG_EXIT)}, (RunState.FAILED, 124)),
    ((NodeState.STOPPED, NodeState.SUCCEEDED), {}, (RunState.UNKNOWN, None)),
])
def test_the_run_state_follows_from_the_nodes(states, kwargs, expected):
    nodes = [NodeEnd(node_rank=i, host=f"n{i}", state=s, exit_code=7 if s is NodeState.FAILED else 0)
             for i, s in enumerate(states)]
    settled = settle(nodes, **kwargs)
    assert (settled.state, settled.exit_code) == expected


def test_a_failed_node_without_its_last_lines_is_named_with_its_own_exit_code():
    settled = settle([NodeEnd(node_rank=1, host="n2", state=NodeState.FAILED, exit_code=9),
                      NodeEnd(node_rank=0, host="n1", state=NodeState.SUCCEEDED, exit_code=0)])
    assert settled.first_failure is not None and settled.first_failure.describe() == "node 1 (n2) exited 9"
