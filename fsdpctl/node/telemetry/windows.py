"""A rank's steps into rows: one row per window of steps, in windows whose ends every rank can share.

Each rank decides its windows alone (no collective of fsdpctl's runs in a user's program), yet the
launcher has to put the ranks' rows of the same steps side by side. So every window ends at a step
``1 + k * width``: the first step alone (start-up, compilation), then windows of ``width`` steps,
a power of two, doubled (at a step where the doubled width ends a window too) until a window lasts
about ``TARGET_S``. Two ranks that picked different widths still end windows at every step where the
wider one does, and ``fsdpctl.metrics.rank_windows`` merges the narrower one's rows up to there.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .steps import Step

TARGET_S = 1.0
"""About how long a window lasts (a row per rank per second at most)."""
MAX_WIDTH = 1024


class Windows:
    """Steps in, finished windows (lists of steps) out."""

    def __init__(self, target_s: float = TARGET_S):
        self.target_s = target_s
        self.width = 1
        self.open: list[Step] = []
        self.recent: list[float] = []

    def add(self, step: Step) -> list[list[Step]]:
        """The windows ``step`` finishes (none, or one)."""
        self.open.append(step)
        if step.number > 1:
            self.recent = [*self.recent[-15:], step.wall_s]
        if (step.number - 1) % self.width:
            return []
        window, self.open = self.open, []
        self._widen(step.number)
        return [window]

    def _widen(self, ended: int) -> None:
        if not self.recent:
            return
        typical = statistics.median(self.recent)
        while (self.width < MAX_WIDTH and self.width * typical < self.target_s
               and (ended - 1) % (2 * self.width) == 0):
            self.width *= 2

    def rest(self) -> list[Step]:
        """The steps of the window still open (at the program's end: its last, shorter window)."""
        window, self.open = self.open, []
        return window


def window_row(steps: list[Step], losses: Iterable[Optional[float]], place: Mapping[str, Any],
               *, comm_seen: bool, extra: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's row for a window: figures per step (``losses``: each step's loss as a float, in
    order). ``comm_seen``: this rank's collectives were timed (else compute is not told apart from
    waiting and neither is written)."""
    count = len(steps)
    wall = sum(s.wall_s for s in steps)
    data = sum(s.data_s for s in steps)
    row: dict[str, Any] = {"step": steps[-1].number, "steps": count, "kind": "train", "source": "hook", **place,
                           "time": round(steps[-1].ended, 3), "wall_s": round(wall / count, 6),
                           "data_s": round(data / count, 6)}
    if comm_seen:
        comm = sum(s.comm_s for s in steps)
        row["comm_s"] = round(comm / count, 6)
        row["compute_s"] = round(max(0.0, wall - data - comm) / count, 6)
    known = [value for value in losses if value is not None]
    if known:
        row["loss"] = statistics.fmean(known)
    tokens = sum(s.tokens for s in steps)
    if tokens and wall > 0:
        row["tokens_per_s"] = round(tokens / wall, 1)
    row["backward_per_step"] = round(sum(s.backward for s in steps) / count, 3)
    untimed = [s.untimed_ops for s in steps if s.untimed_ops is not None]
    if untimed and sum(untimed):
        row["untimed_ops"] = round(sum(untimed) / len(untimed), 2)
    row.update(extra)
    return row
