"""What torchrun's own output says of a failure: its "Root Cause" summary (the failing rank, its exit
code, its error file, when it failed) and whether the rank only lost a peer. Every backend runs one
torchrun per node, and reads a failed node's last lines here."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Optional

from ..node.startup.sitecustomize import ended_marker
from ..node.torchrun_summary import EXITCODE, SUMMARY, summary_block
from ..rundir.state import Failure, shell_exit_code

TAIL_LINES = 30
"""The failing rank's (else the node's) last lines kept with the failure."""
_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ERROR_FILE = re.compile(r"error_file\s*:\s*(\S+)")
_FAILED_AT = re.compile(r"time\s*:\s*(\S+)")
# torchrun's words for a rendezvous store that went away: it lives in the first node's torchrun.
_STORE_LOST = r"connection to the C10d store has failed"
_STORE_GONE = re.compile(_STORE_LOST + r"|RendezvousConnectionError", re.IGNORECASE)
# What a rank says when another one died under it: such a failure is a consequence, not the cause.
# A rank's or torchrun's own words for "another node went away": its collectives' peers, or the
# rendezvous store (its agent dies with that node).
_PEER_GONE = re.compile(r"Connection reset by peer|Connection closed by peer|remote worker|remote process exited|"
                        r"communicator was aborted|Broken pipe|" + _STORE_LOST, re.IGNORECASE)


def store_gone(lines: Iterable[str]) -> bool:
    """A torchrun's last lines say it lost the rendezvous store (the first node's torchrun ended)."""
    return any(_STORE_GONE.search(line) for line in lines)


def has_summary(lines: Sequence[str]) -> bool:
    """torchrun printed its failure summary among these lines."""
    return any(SUMMARY in line for line in lines)


def torchrun_failure(lines: Sequence[str], *, host: Optional[str], node_rank: Optional[int],
                     exit_code: Optional[int], failed_at: Optional[str] = None,
                     lost: Optional[str] = None) -> Failure:
    """The failure a node's last ``lines`` (as its log keeps them: ``[rank<N>]:text``) describe:
    torchrun's summary when it printed one (its rank, exit code, error file and time win), else the
    node itself with ``exit_code``. ``lost``: why the node counts as lost, when it does."""
    rank = local_rank = error_file = None
    code = exit_code
    text = "\n".join(lines)
    block = summary_block(text)
    if block is not None:
        if match := _ROOT_CAUSE.search(block):
            rank, local_rank = int(match.group(1)), int(match.group(2))
        if match := EXITCODE.search(block):
            code = int(match.group(1))
        if match := _ERROR_FILE.search(block):
            error_file = None if match.group(1) == "<N/A>" else match.group(1)
        if match := _FAILED_AT.search(block):
            failed_at = match.group(1)
    if rank is not None:
        own = [line for line in lines if line.startswith(f"[rank{rank}]:")]
        last = (own or list(lines))[-TAIL_LINES:]
    else:
        last = list(lines)[-TAIL_LINES:]
    shell_code, signal = shell_exit_code(code)
    return Failure(kind="lost" if lost else "exit", host=host, node_rank=node_rank,
                   exit_code=shell_code if shell_code else 1, signal=signal, rank=rank, local_rank=local_rank,
                   error_file=error_file, failed_at=failed_at, last_lines=tuple(last),
                   peer_gone=any(_PEER_GONE.search(line) for line in last), detail=lost)


def in_shutdown(failure: Optional[Failure], run_dir: str, attempt: int,
                read: Callable[[str], Optional[str]]) -> Optional[Failure]:
    """``failure`` marked ``in_shutdown`` when its rank died by a signal after its program of this
    ``attempt`` had ended: the start-up hook's marker for that rank, read on the failing node with
    ``read`` (a path -> its text, None when there is none), says so."""
    if failure is None or failure.kind != "exit" or failure.signal is None or failure.rank is None:
        return failure
    text = read(ended_marker(run_dir, failure.rank))
    if text is None or text.strip() != f"attempt {attempt}":
        return failure
    return dataclasses.replace(failure, in_shutdown=True)
