"""What the API reports while it works: a run's lines and the steps around them, as events.

Whoever calls ``launch``, ``submit``, ``Run.wait`` or ``doctor`` may pass ``on_event``, a callable
that receives each event as it happens: the CLI renders them on a terminal, a test collects them, a
notebook may print a few. The API itself never prints. A callback may also have a ``lines(batch)``
method, which then receives a run's lines a batch at a time instead (a flood of output is 100,000s
of lines), and a ``flush()`` method, called after each batch (the CLI writes unflushed, then flushes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Optional, Union

from ..rundir.lines import LogLine

if TYPE_CHECKING:
    from ..hostcheck.checks import DoctorReport, HostReport
    from ..rundir.state import Outcome

Level = Literal["info", "warning", "error", "success"]


@dataclass(frozen=True)
class Notice:
    """Something worth telling whoever follows: a warning, a step taken, a hang's report."""

    text: str
    level: Level = "info"


@dataclass(frozen=True)
class HostChecked:
    """doctor or the preflight has judged one host."""

    report: HostReport


@dataclass(frozen=True)
class PreflightStarted:
    """doctor's fast checks on the nodes of a run about to start (``recheck``: before a restart)."""

    nodes: int
    recheck: bool = False


@dataclass(frozen=True)
class PreflightFailed:
    """A re-check before a restart failed: the run ends here (a first preflight that fails raises
    ``fsdpctl.PreflightError`` instead)."""

    report: DoctorReport


@dataclass(frozen=True)
class RunStarted:
    """A run (or its next attempt) was started, or submitted to its scheduler."""

    run_id: str
    how: str
    """In a few words: "started on 2 node(s), world size 2", "submitted as Slurm job 12"."""
    run_dir: str
    """The run's directory here."""
    attempt: int = 1
    detached: bool = False
    """It outlives the call that started it (``detach=True``, or a submission not followed)."""
    world: Optional[int] = None
    """Its ranks, where the plan knows them (None: counted on the nodes)."""


@dataclass(frozen=True)
class AttemptStarting:
    """A failed attempt is followed by another (``max_restarts``)."""

    run_id: str
    attempt: int
    last_attempt: int
    from_step: Optional[int]
    """The checkpoint step the bundled workload continues from."""
    after: str
    """What ended the previous attempt, in a few words."""


@dataclass(frozen=True)
class RunEnded:
    """Following a run has ended: how the run ended, or (``outcome.left``) that the follower left."""

    run_id: str
    outcome: Outcome
    run_dir: str


@dataclass(frozen=True)
class HangSuspected:
    """The hang watchdog saw no progress for ``silent_s`` seconds; the stacks were read (``odd``: what
    they say, in a line), and the run is ended (``stopping``) or left to go on."""

    run_id: str
    silent_s: float
    odd: str
    stopping: bool


@dataclass(frozen=True)
class EnvironmentProgress:
    """Bytes of wheels sent to the nodes for their environment so far, of ``total`` (every node together)."""

    sent: int
    total: int


@dataclass(frozen=True)
class Fetched:
    """Files brought back from the nodes: per node, the local files (empty: no such path there)."""

    files: dict[str, list[str]] = field(default_factory=dict)


Event = Union[LogLine, Notice, HostChecked, PreflightStarted, PreflightFailed, RunStarted, AttemptStarting,
              RunEnded, HangSuspected, Fetched, EnvironmentProgress]
EventHandler = Callable[[Event], None]


class Emitter:
    """Hands events to the caller's handler (or drops them when there is none)."""

    def __init__(self, handler: Optional[EventHandler] = None):
        self.handler = handler
        self._flush = getattr(handler, "flush", None)
        batch = getattr(handler, "lines", None)
        self._lines = batch if callable(batch) else None

    def __call__(self, event: Event) -> None:
        if self.handler is not None:
            self.handler(event)

    def lines(self, batch: list[LogLine]) -> None:
        """A batch of a run's lines, in order."""
        if self._lines is not None:
            self._lines(batch)
        elif self.handler is not None:
            for line in batch:
                self.handler(line)

    def flush(self) -> None:
        if self._flush is not None:
            self._flush()

    def notice(self, text: str, level: Level = "info") -> None:
        self(Notice(text, level))
