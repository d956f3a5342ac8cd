"""``fsdpctl report``'s table of every rank: where it ran, its compute, collective wait and data wait
per step (step-weighted means over the run's windows: ``fsdpctl.metrics.rank_figures``), its peak
memory, the collectives a step it could not time, and the straggler marked.

Above ``FOLD_ABOVE`` ranks the text shows the slowest, the median and the fastest rank and the
straggler, with a line saying how many are left out (``--ranks`` shows them all; ``--json`` and
``--html`` always do). Ranks are ordered by the time each spent on its own, compute plus data wait:
in synchronous training every rank's step lasts as long, the others waiting in collectives for the
slowest, so that time is what sets a straggler apart, whether its compute or its input is slow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

FOLD_ABOVE = 8
"""More ranks than this and the text shows a few of them (a screen's worth at 16 x 8 ranks is no table)."""
UNTIMED_NOTE = ("untimed collectives: per step, those that ran inside compiled code; fsdpctl cannot time them, "
                "so their time counts as compute")
NOT_KEPT_NOTE = ("no per-rank table: this run's chart index was written by an fsdpctl that did not keep each "
                 "rank's figures")
HEADING = "each rank, seconds per step (step-weighted means over the run's windows):"


def own_time(entry: Mapping[str, Any]) -> float:
    """Seconds a step the rank spent on its own (compute plus data wait), what orders the ranks."""
    return float(entry.get("compute_s") or 0.0) + float(entry.get("data_s") or 0.0)


def has_untimed(ranks: Sequence[Mapping[str, Any]]) -> bool:
    return any(e.get("untimed_ops") for e in ranks)


def columns(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The table's header (the untimed collectives' column only where a rank has some)."""
    return ["rank", "node", "host", "compute", "collective wait", "data wait", "peak memory",
            *(["untimed collectives"] if has_untimed(ranks) else [])]


def cells(entry: Mapping[str, Any], untimed: bool) -> list[str]:
    """One rank's row, as text, in ``columns``' order."""
    memory = entry.get("mem_mb")
    row = [str(entry.get("rank", "-")), _text(entry.get("node")), _text(entry.get("host")),
           _seconds(entry.get("compute_s")), _seconds(entry.get("comm_s")), _seconds(entry.get("data_s")),
           "-" if memory is None else f"{memory:,.0f} MB"]
    if untimed:
        count = entry.get("untimed_ops")
        row.append("-" if count is None else f"{count:g}")
    return row


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _seconds(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def shown(ranks: Sequence[Mapping[str, Any]], every_rank: bool) -> tuple[list[tuple[Mapping[str, Any], str]], int]:
    """The ranks the text shows, each with its mark ("straggler"; when folded also "slowest",
    "median", "fastest"), and how many it leaves out. All of them, in rank order, up to
    ``FOLD_ABOVE`` or with ``every_rank``; else the folded few, slowest first."""
    if every_rank or len(ranks) <= FOLD_ABOVE:
        return [(e, "straggler" if e.get("straggler") else "") for e in ranks], 0
    order = sorted(range(len(ranks)), key=lambda i: (own_time(ranks[i]), i))  # fastest first
    marks: dict[int, list[str]] = {}
    for label, position in (("slowest", order[-1]), ("median", order[(len(order) - 1) // 2]), ("fastest", order[0])):
        marks.setdefault(position, []).append(label)
    for position, entry in enumerate(ranks):
        if entry.get("straggler"):
            marks.setdefault(position, []).append("straggler")
    place = {position: at for at, position in enumerate(order)}
    picked = sorted(marks, key=lambda i: -place[i])
    return [(ranks[i], ", ".join(marks[i])) for i in picked], len(ranks) - len(picked)


def table_lines(ranks: Sequence[Mapping[str, Any]], every_rank: bool = False) -> list[str]:
    """The text: a heading, the table, and what it left out or could not time."""
    untimed = has_untimed(ranks)
    rows, hidden = shown(ranks, every_rank)
    grid = [columns(ranks) + [""], *(cells(e, untimed) + [mark] for e, mark in rows)]
    widths = [max(len(r[c]) for r in grid) for c in range(len(grid[0]))]
    left = {2, len(widths) - 1}  # the host and the mark read from the left, figures from the right
    lines = [HEADING]
    for row in grid:
        padded = (v.ljust(w) if c in left else v.rjust(w) for c, (v, w) in enumerate(zip(row, widths, strict=True)))
        lines.append("  " + "  ".join(padded).rstrip())
    if hidden:
        lines.append(f"  ... {hidden} more ranks not shown (fsdpctl report --ranks shows every rank)")
    if untimed:
        lines.append(f"  {UNTIMED_NOTE}")
    return lines
