"""A run's figures over its whole length for charts (the dashboard, ``report --html``), in bounded
memory however long the run: every series is kept as buckets of consecutive points, adjacent buckets
merged in pairs once there are twice ``POINTS`` of them, so a chart never draws more than a few
thousand points (100,000 steps or a week of GPU samples alike) and the figures stay exact sums,
minimums and maximums of what they hold.

``ChartStore`` reads a run's metrics copies and GPU samples as they grow (new bytes only; a file of
more than ``SEED_BYTES`` when first seen is sampled for its history, so a page opens at once on a run
of days) into: the
training and validation curves by step; each rank's compute time by window (the heat map) and by
wall time; each node's GPUs by wall time (SM clock, utilisation, temperature, power, memory, and
whether a slowdown reason was active).
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from . import layout
from .metrics_feed import MetricsFeed
from .tails import LineTail

SEED_BYTES = 16 << 20
"""A metrics or samples file longer than this is sampled for its history instead of read whole."""
SAMPLED = 2000
POINTS = 1000
"""Buckets a series keeps at least (at most twice as many) before merging pairs."""
GPU_FIGURES = ("sm_mhz", "util_pct", "temp_c", "power_w", "mem_mib")


class Buckets:
    """One series: x in order, y summed per bucket of ``width`` consecutive points (mean, min, max)."""

    __slots__ = ("x", "total", "low", "high", "count", "points", "width", "limit")

    def __init__(self, limit: int = POINTS):
        self.limit = limit
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

    def means(self) -> list[Optional[float]]:
        return [t / c if c else None for t, c in zip(self.total, self.count, strict=True)]

    def to_json(self, *, extremes: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {"x": [round(v, 3) for v in self.x], "y": _rounded(self.means())}
        if extremes:
            data["low"] = _rounded([v if c else None for v, c in zip(self.low, self.count, strict=True)])
            data["high"] = _rounded([v if c else None for v, c in zip(self.high, self.count, strict=True)])
        return data


def _rounded(values: Iterable[Optional[float]]) -> list[Optional[float]]:
    return [None if v is None or v != v else float(f"{v:.6g}") for v in values]


class HeatMap:
    """Every rank's compute time by window, in columns that span the same windows for every rank."""

    def __init__(self, limit: int = POINTS // 2):
        self.limit = limit
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
                           "compute_s": _rounded(col[r][0] / col[r][1] if r in col and col[r][1] else None
                                                 for col in self.columns)} for r in ranks]}


class ChartStore:
    """One run's chart data, brought up to date from its files here (``update``); ``to_json`` is what
    a page draws."""

    def __init__(self, root: Path, plan: Any, world_size: Optional[int] = None,
                 sources: Optional[tuple[list[Path], list[Path]]] = None):
        self.root, self.plan, self.sources = root, plan, sources
        self.feed = MetricsFeed(world_size, on_row=self._row, on_attempt=self.attempt_began)
        self.metric_tails: dict[Path, LineTail] = {}
        self.gpu_tails: dict[Path, LineTail] = {}
        self.train = {key: Buckets() for key in ("loss", "tokens_per_s", "mfu", "step_time_s")}
        self.val = Buckets()
        self.heat = HeatMap()
        self.rank_time: dict[int, Buckets] = {}
        self.gpus: dict[tuple[int, str, str], dict[str, Buckets]] = {}
        self.gpu_top: dict[tuple[int, str, str], float] = {}
        self.last_sample: dict[tuple[int, str], float] = {}

    def update(self) -> bool:
        """Read what the files gained; True when anything came."""
        plan = self.plan
        metrics, gpus = self.sources or (layout.metrics_files(self.root, plan),
                                         layout.gpu_files(self.root, plan))
        came = False
        for path in metrics:
            tail = self.metric_tails.get(path)
            if tail is None:
                tail = self.metric_tails[path] = LineTail(path)
                came = self._seed(path, tail, self.feed.add_lines) or came
            came = self.feed.add_lines(tail.read()) or came
        for path in gpus:
            tail = self.gpu_tails.get(path)
            if tail is None:
                tail = self.gpu_tails[path] = LineTail(path)
                came = self._seed(path, tail, self._samples) or came
            lines = tail.read()
            came = bool(lines) or came
            self._samples(lines)
        return came

    @staticmethod
    def _seed(path: Path, tail: LineTail, take: Any) -> bool:
        """A file too long to read at once (a run of days): ``SAMPLED`` of its lines, evenly spread
        from its start to its end, stand for its history (the charts are drawn at once); what it gains
        from now on is read whole."""
        try:
            size = path.stat().st_size
        except OSError:
            return False
        if size <= SEED_BYTES:
            return False
        lines = []
        with path.open("rb") as handle:
            for i in range(SAMPLED):
                handle.seek(size * i // SAMPLED)
                handle.readline()  # the rest of the line the seek cut
                line = handle.readline()
                if line.endswith(b"\n"):
                    lines.append(line.decode("utf-8", "replace"))
            tail.inode, tail.offset = os.fstat(handle.fileno()).st_ino, size
        take(lines)
        return bool(lines)

    def _row(self, kind: str, row: dict[str, Any]) -> None:
        step = row["step"]
        if kind == "val":
            self.val.add(step, _number(row.get("val_loss")))
            return
        for key, series in self.train.items():
            series.add(step, _number(row.get(key)))
        ranks = [e for e in row.get("ranks") or () if isinstance(e, dict)]
        if ranks:
            self.heat.add(step, ranks)
            when = _number(row.get("time"))
            if when is not None:
                for entry in ranks:
                    self.rank_time.setdefault(int(entry.get("rank", 0)), Buckets()).add(
                        when, _number(entry.get("compute_s")))

    def attempt_began(self, from_step: int) -> None:
        """A later attempt resumed from ``from_step``: the curves by step drop what it trains again."""
        for series in (*self.train.values(), self.val):
            series.drop_after(from_step)
        self.heat.drop_after(from_step)

    def _samples(self, lines: list[str]) -> None:
        for line in lines:
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            if not isinstance(sample, dict) or not isinstance(sample.get("node"), int):
                continue
            node, host, t = sample["node"], str(sample.get("host") or ""), _number(sample.get("t"))
            if t is None or t <= self.last_sample.get((node, host), float("-inf")):
                continue  # read again, or out of order
            self.last_sample[(node, host)] = t
            for gpu in sample.get("gpus") or ():
                key = (node, host, str(gpu.get("index")))
                series = self.gpus.setdefault(key, {name: Buckets() for name in (*GPU_FIGURES, "slowed")})
                for name in GPU_FIGURES:
                    series[name].add(t, _number(gpu.get(name)))
                series["slowed"].add(t, 1.0 if gpu.get("reasons") else 0.0)
                top = _number(gpu.get("sm_max_mhz"))
                if top:
                    self.gpu_top[key] = top

    def to_json(self) -> dict[str, Any]:
        """The charts' data: curves by step, the heat map, each rank's and GPU's figures by time."""
        train = {key: series.to_json() for key, series in self.train.items()}
        return {
            "train": train, "val": self.val.to_json(), "heat": self.heat.to_json(),
            "rank_time": [{"rank": rank, "node": self.heat.where.get(rank, (None, None))[0],
                           "host": self.heat.where.get(rank, (None, None))[1], **series.to_json()}
                          for rank, series in sorted(self.rank_time.items())],
            "gpus": [{"node": node, "host": host, "gpu": gpu, "sm_max_mhz": self.gpu_top.get((node, host, gpu)),
                      **{name: s.to_json(extremes=name == "sm_mhz") for name, s in series.items()}}
                     for (node, host, gpu), series in sorted(self.gpus.items())],
        }


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
