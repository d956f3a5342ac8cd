"""What a run is and how it ended, as types: its state, the first failure, the outcome of following it.

These are the words ``run.json`` keeps and the public API returns. States are one enum (a backend
maps its own words, a scheduler's job states, into it); a failure is one dataclass, built where
the backends learn of it and shown by ``describe``/``headline`` wherever it is shown, so a rank
killed by SIGKILL reads "exited 137 (SIGKILL)" live, in ``status`` and in the attempt history alike.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Optional


class RunState(str, Enum):
    """Where a run stands. A ``str`` so that run.json and ``--json`` keep plain words."""

    STARTING = "starting"
    SUBMITTED = "submitted"
    """Waiting in a scheduler's queue."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    """Ended by ``fsdpctl stop`` / ``Run.stop()``."""
    INTERRUPTED = "interrupted"
    """Its launcher was interrupted (Ctrl-C, SIGTERM, SIGHUP) and stopped every node."""
    TIMEOUT = "timeout"
    """Slurm's time limit (or deadline) ended it."""
    CANCELLED = "cancelled"
    """Cancelled in Slurm by something other than fsdpctl."""
    NODE_FAIL = "node_fail"
    PREEMPTED = "preempted"
    OUT_OF_MEMORY = "out_of_memory"
    UNKNOWN = "unknown"
    """Nobody can tell any more (a scheduler that forgot the job and keeps no accounting)."""

    def __str__(self) -> str:
        return self.value

    @property
    def is_over(self) -> bool:
        """The run has ended, one way or another."""
        return self not in (RunState.STARTING, RunState.SUBMITTED, RunState.RUNNING)

    @property
    def is_failure(self) -> bool:
        """It ended badly on its own (not a success, not stopped or interrupted by its user)."""
        return self.is_over and self not in (RunState.SUCCEEDED, RunState.STOPPED, RunState.INTERRUPTED,
                                             RunState.UNKNOWN)

    @classmethod
    def parse(cls, value: Any) -> RunState:
        """A state as run.json (of any fsdpctl version) or Slurm spells it; UNKNOWN when unreadable."""
        if isinstance(value, RunState):
            return value
        try:
            return cls(str(value or "").strip().lower())
        except ValueError:
            return RunState.UNKNOWN


class NodeState(str, Enum):
    """Where one node's part of a run stands."""

    STARTING = "starting"
    PENDING = "pending"
    """Waiting for the scheduler."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost"
    """It stopped answering while the run was followed."""
    STOPPED = "stopped"
    UNREACHABLE = "unreachable"
    """It did not answer when asked just now."""
    GONE = "gone"
    """Its script's wrapper vanished without leaving an exit status."""
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: Any) -> NodeState:
        try:
            return cls(str(value or "").lower())
        except ValueError:
            return cls.UNKNOWN


def shell_exit_code(code: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """An exit code as a shell reports it, and the signal behind it: torchrun reports a worker killed
    by signal N as -N, a shell as 128+N."""
    if code is None:
        return None, None
    if code < 0:
        return 128 - code, -code
    if 128 < code < 128 + 65:
        return code, code - 128
    return code, None


def signal_name(number: Optional[int]) -> Optional[str]:
    """``SIGKILL`` for 9; None for no signal or one this system does not name."""
    if not number:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return None


FailureKind = Literal["exit", "lost", "hang", "refused", "resize"]


@dataclass(frozen=True, kw_only=True)
class Failure:
    """The failure that ended a run: a rank or node that exited non-zero, a node that stopped
    answering, a hang the watchdog ended, or a job its scheduler refused (no node ever ran it)."""

    kind: FailureKind
    host: Optional[str]
    node_rank: Optional[int]
    exit_code: int
    """As a shell reports it: 137 for a process killed by SIGKILL."""
    rank: Optional[int] = None
    """The failing rank's global rank, when torchrun named it."""
    local_rank: Optional[int] = None
    signal: Optional[int] = None
    """The signal that ended it, when one did."""
    detail: Optional[str] = None
    """Why a node counts as lost, what the hang watchdog saw, or the scheduler's own words for
    refusing the job."""
    error: Optional[str] = None
    """The last line of the failing rank's error message (its torchelastic error file)."""
    error_file: Optional[str] = None
    """That error file, on the failing node."""
    failed_at: Optional[str] = None
    """When torchrun saw it fail (its own time stamp), else when fsdpctl did."""
    last_lines: tuple[str, ...] = ()
    """The failing rank's (else node's) last lines."""
    peer_gone: bool = False
    """Its last lines only say that a peer went away: a consequence, not a cause."""
    hang_dir: Optional[str] = None
    """Where the hang's stacks and flight-recorder dumps are kept."""
    in_shutdown: bool = False
    """The rank's program had ended (fsdpctl's start-up hook saw every exit handler run) when the
    signal came: it died in Python's own shutdown, its work done."""

    @property
    def signal_name(self) -> Optional[str]:
        """The signal's name (``SIGKILL``), when a signal ended it."""
        return signal_name(self.signal)

    def _exited(self) -> str:
        name = self.signal_name
        when = " in Python's shutdown, after its program had ended" if self.in_shutdown else ""
        return f"exited {self.exit_code}" + (f" ({name})" if name else "") + when

    def describe(self) -> str:
        """The failure in a few words: "rank 1 on n2 exited 137 (SIGKILL)", "n2 (node 1) was lost",
        "a hang (...)", "sbatch refused the job: ..."."""
        if self.kind == "hang":
            return f"a hang ({self.detail})"
        if self.kind in ("refused", "resize"):
            return str(self.detail)
        if self.kind == "lost":
            return f"{self.host} (node {self.node_rank}) was lost"
        if self.rank is not None:
            return f"rank {self.rank} on {self.host} {self._exited()}"
        return f"node {self.node_rank} ({self.host}) {self._exited()}"

    def headline(self) -> str:
        """The failure in one line, everything named: "rank 1 (local rank 0) on n2 (node 1) exited 137
        (SIGKILL)", "n2 (node 1) was lost: nothing heard from it since ...", "hung: no progress ...",
        "sbatch refused the job: ..."."""
        if self.kind == "hang":
            return f"hung: {self.detail}"
        if self.kind in ("refused", "resize"):
            return str(self.detail)
        if self.kind == "lost":
            return f"{self.host} (node {self.node_rank}) was lost: {self.detail}"
        who = f"rank {self.rank} (local rank {self.local_rank}) on " if self.rank is not None else ""
        return f"{who}{self.host} (node {self.node_rank}) {self._exited()}"

    def to_json(self) -> dict[str, Any]:
        """As run.json keeps it (``state``, ``lost`` and ``hang`` as older fsdpctl versions wrote them)."""
        data: dict[str, Any] = {
            "kind": self.kind, "host": self.host, "node_rank": self.node_rank, "rank": self.rank,
            "local_rank": self.local_rank, "exit_code": self.exit_code, "signal": self.signal,
            "state": {"exit": "failed", "lost": "lost", "hang": "hung", "refused": "refused",
                      "resize": "stopped"}[self.kind],
            "error": self.error, "error_file": self.error_file, "failed_at": self.failed_at,
            "last_lines": list(self.last_lines), "peer_gone": self.peer_gone,
        }
        if self.in_shutdown:
            data["in_shutdown"] = True
        if self.kind == "lost":
            data["lost"] = self.detail
        if self.kind == "hang":
            data.update(hang=self.detail, hang_dir=self.hang_dir)
        if self.kind in ("refused", "resize"):
            data[self.kind] = self.detail
        return data

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> Optional[Failure]:
        """run.json's ``first_failure`` (of any fsdpctl version) back as a Failure; None when absent."""
        if not data:
            return None
        kind: FailureKind = data.get("kind") or ("hang" if data.get("hang") else "lost" if data.get("lost")
                                                 else "exit")
        raw = data.get("exit_code")
        code, sig = shell_exit_code(raw if isinstance(raw, int) else None)
        return cls(kind=kind, host=data.get("host"), node_rank=data.get("node_rank"),
                   exit_code=code if code is not None else 1, rank=data.get("rank"),
                   local_rank=data.get("local_rank"), signal=data.get("signal") or sig,
                   detail=data.get(kind) if kind in ("hang", "refused", "resize") else data.get("lost"),
                   error=data.get("error"),
                   error_file=data.get("error_file"), failed_at=data.get("failed_at"),
                   last_lines=tuple(data.get("last_lines") or ()), peer_gone=bool(data.get("peer_gone")),
                   hang_dir=data.get("hang_dir"), in_shutdown=bool(data.get("in_shutdown")))


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How following a run ended: the run's exit code and state, and its first failure. A state
    that is not over means the follower left and the run goes on."""

    exit_code: int
    state: RunState
    first_failure: Optional[Failure] = None
    message: Optional[str] = None
    """One line that says how it ended, where there is more to say than the state."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Lines worth showing with it (a batch script's last output)."""
    interrupted_by: Optional[int] = None
    """The signal (SIGINT for a KeyboardInterrupt) that stopped the launcher or the follower."""

    @property
    def ok(self) -> bool:
        """The run succeeded with exit 0."""
        return self.state is RunState.SUCCEEDED and self.exit_code == 0

    @property
    def left(self) -> bool:
        """The follower stopped following before the end; the run goes on."""
        return not self.state.is_over
