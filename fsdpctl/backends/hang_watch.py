"""The hang watchdog's clock: when a followed run last made progress, and when that is too long ago.

Whoever follows a run (the launcher, ``logs -f``, Slurm's follow loop) shows it every line; the
decision of what a hang means (gather stacks, end the run) is the ``on_hang`` it was given.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Optional

from ..rundir.outcome import HANG_EXIT
from ..rundir.state import Failure

__all__ = ["HANG_EXIT", "HangVerdict", "HangWatch"]


@dataclass(frozen=True)
class HangVerdict:
    """What the watchdog's handler decided: end the run or not, and the failure to record."""

    stop: bool
    failure: Failure


@dataclass
class HangWatch:
    """``timeout`` seconds without progress is a hang. Progress is a line matching ``progress`` (any
    line when None); until the first such line, any line counts (a program starting up, compiling)."""

    timeout: float
    on_hang: Callable[[float], HangVerdict]
    progress: Optional[re.Pattern] = None
    last_progress: float = field(default_factory=time.monotonic)
    reported: bool = False
    """A hang was reported and no progress came since: one report per stall."""
    started: bool = False
    """A progress line was seen."""

    def saw(self, line: str) -> None:
        matched = self.progress is None or bool(self.progress.search(line))
        if matched or not self.started:
            self.last_progress, self.reported = time.monotonic(), False
        self.started = self.started or matched

    def saw_any(self, lines: Iterable[str]) -> None:
        """A batch of lines: as ``saw`` for each, but the clock is read once."""
        search = self.progress.search if self.progress is not None else None
        matched = search is None or any(search(line) for line in lines)
        if matched or not self.started:
            self.last_progress, self.reported = time.monotonic(), False
        self.started = self.started or matched

    def due(self) -> Optional[float]:
        """Seconds without progress, once they pass the timeout (and the stall was not reported yet)."""
        silent = time.monotonic() - self.last_progress
        return silent if silent > self.timeout and not self.reported else None

    def fire(self, silent: float) -> HangVerdict:
        self.reported = True
        return self.on_hang(silent)
