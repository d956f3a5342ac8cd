"""A chart's series in bounded memory: ``Buckets`` (one curve: points in order, summed by buckets of
consecutive points, adjacent buckets merged in pairs once there are twice ``POINTS`` of them) and
``HeatMap`` (every rank's figure by window, in columns that span the same windows for every rank).
The figures stay exact sums, minimums and maximums of what they hold."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Any, Optional

POINTS = 1000
"""Buckets a series keeps at least (at most twice as many) before merging pairs."""


class Buckets:
    """One series: x in order, y summed per bucket of ``width`` consecutive points (mean, min, max)."""

    __slots__ = ("x", "total", "low", "high", "count", "points", "width", "limit")

    def __init__(self, limit: Optional[int] = None):
        self.limit = limit or POINTS
        self.width = 1
        self.x, self.total, self.low, self.high = array("d"), array("d"), array("d"), array("d")
        self.count = array("l")  # values in each bucket (a gap is a point without one)
        self.points = 0  # points in the last bucket

    def add(self, x: float, y: Optional[float]) -> None:
        """One point (``y`` None: the x is kept, as a gap)."""
        value = float("nan") if y is None else float(y)
        if self.x and self.points < self.width:
            self.points += 1
            if value == value:  # not a gap
                if self.total[-1] != self.total[-1]:
                    self.total[-1], self.low[-1], self.high[-1] = value, value, value
                else:
                    self.total[-1] += value
                    self.low[-1], self.high[-1] = min(self.low[-1], value), max(self.high[-1], value)
                self.count[-1] += 1
            return
        self.x.append(x)
        self.total.append(value)
        self.low.append(value)
        self.high.append(value)
        self.count.append(1 if value == value else 0)
        self.points = 1
        if len(self.x) >= 2 * self.limit:
            self._halve()

    def _halve(self) -> None:
        """Merge adjacent buckets in pairs: twice the width, half the buckets."""
        x, total, low, high, count = array("d"), array("d"), array("d"), array("d"), array("l")
        for i in range(0, len(self.x) - 1, 2):
            x.append(self.x[i])
            parts = [(self.total[j], self.low[j], self.high[j], self.count[j]) for j in (i, i + 1) if self.count[j]]
            total.append(sum(p[0] for p in parts) if parts else float("nan"))
            low.append(min(p[1] for p in parts) if parts else float("nan"))
            high.append(max(p[2] for p in parts) if parts else float("nan"))
            count.append(sum(p[3] for p in parts))
        if len(self.x) % 2:
            x.append(self.x[-1])
            total.append(self.total[-1])
            low.append(self.low[-1])
            high.append(self.high[-1])
            count.append(self.count[-1])
        # the last bucket's points: its own alone (odd count), or merged with the full one before it
        self.points = self.points if len(self.x) % 2 else self.width + self.points
        self.x, self.total, self.low, self.high, self.count = x, total, low, high, count
        self.width *= 2

    def drop_after(self, x: float) -> None:
        """Forget the buckets that begin after ``x`` (a restarted attempt trains those steps again)."""
        keep = sum(1 for v in self.x if v <= x)
        for name in ("x", "total", "low", "high", "count"):
            setattr(self, name, getattr(self, name)[:keep])

    def _shown(self) -> tuple[Any, Any, Any, Any, Any]:
        """What is drawn: the buckets, or adjacent pairs of them merged while there are more than
        ``limit`` (a chart holds no more points than a screen has pixels across)."""
        if len(self.x) <= self.limit:
            return self.x, self.total, self.low, self.high, self.count
        x, total, low, high, count = [], [], [], [], []
        for i in range(0, len(self.x), 2):
            pair = [j for j in (i, i + 1) if j < len(self.x) and self.count[j]]
            x.append(self.x[i])
            total.append(sum(self.total[j] for j in pair) if pair else float("nan"))
            low.append(min(self.low[j] for j in pair) if pair else float("nan"))
            high.append(max(self.high[j] for j in pair) if pair else float("nan"))
            count.append(sum(self.count[j] for j in pair))
        return x, total, low, high, count

    def means(self) -> list[Optional[float]]:
        _, total, _, _, count = self._shown()
        return [t / c if c else None for t, c in zip(total, count, strict=True)]

    def to_json(self, *, extremes: bool = False) -> dict[str, Any]:
        x, total, low, high, count = self._shown()
        data: dict[str, Any] = {"x": [round(v, 2) for v in x],
                                "y": rounded(t / c if c else None for t, c in zip(total, count, strict=True))}
        if extremes:
            data["low"] = rounded([v if c else None for v, c in zip(low, count, strict=True)])
            data["high"] = rounded([v if c else None for v, c in zip(high, count, strict=True)])
        return data


def rounded(values: Iterable[Optional[float]]) -> list[Optional[float]]:
    return [None if v is None or v != v else float(f"{v:.6g}") for v in values]


class HeatMap:
    """Every rank's compute time by window, in columns that span the same windows for every rank."""

    def __init__(self, limit: Optional[int] = None):
        """``limit``: columns kept at least (at most twice as many; default: 250-500 columns of every
        rank, a pixel or more each across a page)."""
        self.limit = limit or POINTS // 4
        self.width = 1
        self.steps: list[int] = []
        self.columns: list[dict[int, list[float]]] = []  # per column: rank -> [sum, count]
        self.where: dict[int, tuple[Any, Any]] = {}  # rank -> (node, host)

    def add(self, step: int, entries: list[dict[str, Any]]) -> None:
        if not self.columns or self.columns[-1].get(-1, [0, 0])[1] >= self.width:
            self.steps.append(step)
            self.columns.append({-1: [0.0, 0]})  # -1: how many windows the column holds
        column = self.columns[-1]
        column[-1][1] += 1
        for entry in entries:
            value = entry.get("compute_s")
            if isinstance(value, (int, float)):
                rank = int(entry.get("rank", 0))
                self.where[rank] = (entry.get("node"), entry.get("host"))
                cell = column.setdefault(rank, [0.0, 0])
                cell[0] += float(value)
                cell[1] += 1
        if len(self.columns) >= 2 * self.limit:
            merged_steps, merged = [], []
            for i in range(0, len(self.columns), 2):
                pair = self.columns[i:i + 2]
                combined: dict[int, list[float]] = {}
                for col in pair:
                    for rank, (total, count) in col.items():
                        cell = combined.setdefault(rank, [0.0, 0])
                        cell[0] += total
                        cell[1] += count
                merged_steps.append(self.steps[i])
                merged.append(combined)
            self.steps, self.columns, self.width = merged_steps, merged, self.width * 2

    def drop_after(self, step: int) -> None:
        keep = sum(1 for s in self.steps if s <= step)
        self.steps, self.columns = self.steps[:keep], self.columns[:keep]

    def to_json(self) -> dict[str, Any]:
        ranks = sorted(self.where)
        return {"steps": self.steps, "windows_per_column": self.width,
                "ranks": [{"rank": r, "node": self.where[r][0], "host": self.where[r][1],
                           "compute_s": rounded(col[r][0] / col[r][1] if r in col and col[r][1] else None
                                                 for col in self.columns)} for r in ranks]}
