"""The newest step a run's attempt reached, as its metrics rows say it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..rundir.rundir import RunDir


def newest_step(run: RunDir) -> Optional[int]:
    """The newest step any rank of the attempt reached, in the metrics rows of the run (the bundled
    workload's, a program's own, fsdpctl's rank telemetry's; the nodes' files where they are readable
    here, else the copies collected): rows of another attempt, and rows before the collector's line
    that began this one, do not count. None when no row says one."""
    from ..metrics.rows import ATTEMPT_MARK, parse_row
    from ..node.events import EVENT
    from .layout import metrics_files

    attempt, newest = run.record.attempt, None
    for path in metrics_files(run.root, run.plan):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        mine: Optional[int] = None
        for line in text.splitlines():
            row = parse_row(line)
            if row is None or EVENT in row:
                continue
            if ATTEMPT_MARK in row:
                mine = None  # what came before was an earlier attempt's
            elif isinstance(row.get("step"), int) and row.get("attempt", attempt) == attempt:
                mine = max(mine or 0, row["step"])
        if mine is not None:
            newest = max(newest or 0, mine)
    return newest
