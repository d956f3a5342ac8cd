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
GPU_FIGURES = ("sm_mhz",)
"""A GPU's figures kept by time: its SM clock (with when it was slowed, what a straggler's cause shows).
Its utilisation, temperature, power and memory are shown as they are now (the node table) and go to
the exports whole; kept here too they would triple the charts' size for curves no page draws."""


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
                                "y": _rounded(t / c if c else None for t, c in zip(total, count, strict=True))}
        if extremes:
            data["low"] = _rounded([v if c else None for v, c in zip(low, count, strict=True)])
            data["high"] = _rounded([v if c else None for v, c in zip(high, count, strict=True)])
        return data


def _rounded(values: Iterable[Optional[float]]) -> list[Optional[float]]:
    return [None if v is None or v != v else float(f"{v:.6g}") for v in values]


class HeatMap:
    """Every rank's compute time by window, in columns that span the same windows for every rank."""

    def __init__(self, limit: int = POINTS // 4):
        """``limit``: columns kept at least (at most twice as many): 250-500 columns of every rank, a
        pixel or more each across a page."""
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
                 sources: Optional[tuple[list[Path], list[Path]]] = None, use_index: bool = True):
        """``sources``: the metrics and GPU sample files to read (default: the run's, as ``layout``
        finds them); ``use_index``: begin from the run's chart index (``chart_index``) when it is
        usable, read only what the files gained after it."""
        self.root, self.plan, self.sources = root, plan, sources
        self.world_size = world_size
        self.use_index = use_index
        self.index_loaded: Optional[bool] = None
        """Whether the index was used (None: not looked for yet)."""
        self.reset()

    def reset(self) -> None:
        """Forget everything read (the files are read again from their start)."""
        self.feed = MetricsFeed(self.world_size, on_row=self._row, on_attempt=self.attempt_began)
        self.metric_tails: dict[Path, LineTail] = {}
        self.gpu_tails: dict[Path, LineTail] = {}
        self.train = {key: Buckets() for key in ("loss", "tokens_per_s", "mfu", "step_time_s")}
        self.val = Buckets()
        self.heat = HeatMap()
        self.rank_time: dict[int, Buckets] = {}
        self.gpus: dict[tuple[int, str, str], dict[str, Buckets]] = {}
        self.gpu_top: dict[tuple[int, str, str], float] = {}
        self.last_sample: dict[tuple[int, str], float] = {}
        self.sampled = False
        """A file's history was sampled (``_seed``), not read whole: the charts stand for it in outline."""

    @property
    def index_path(self) -> Path:
        from .chart_index import INDEX_NAME

        return layout.live_dir(self.root) / INDEX_NAME

    def files(self) -> tuple[list[Path], list[Path]]:
        """The metrics and GPU sample files read."""
        return self.sources or (layout.metrics_files(self.root, self.plan), layout.gpu_files(self.root, self.plan))

    def save_index(self) -> bool:
        """Write what this store holds as the run's chart index; False when it cannot be written here
        (a run directory of another user's, a full disk: readers then read the files)."""
        from .chart_index import save

        if not layout.live_dir(self.root).is_dir():
            return False
        try:
            save(self, self.index_path)
        except OSError:
            return False
        return True

    def update(self) -> bool:
        """Read what the files gained (the first time: from where the run's chart index stops, when
        it is usable); True when anything came."""
        metrics, gpus = self.files()
        came = False
        if self.index_loaded is None:
            self.index_loaded = False
            if self.use_index:
                from .chart_index import load

                self.index_loaded = came = load(self, self.index_path, metrics, gpus)
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

    def _seed(self, path: Path, tail: LineTail, take: Any) -> bool:
        """A file too long to read at once (a run of days): ``SAMPLED`` of its lines, evenly spread
        from its start to its end, stand for its history (the charts are drawn at once); what it gains
        from now on is read whole."""
        try:
            size = path.stat().st_size
        except OSError:
            return False
        if size <= SEED_BYTES:
            return False
        self.sampled = True
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

    def node_of(self, rank: int) -> Optional[int]:
        """The node a rank ran on: as its rows said, else by the plan's ranks per node."""
        node = self.heat.where.get(rank, (None, None))[0]
        if isinstance(node, int):
            return node
        first = 0  # the plan's nodes hold consecutive ranks, each node as many as its ``nproc``
        for planned in getattr(self.plan, "nodes", None) or ():
            count = int(planned.nproc) if str(getattr(planned, "nproc", "")).isdigit() else 0
            if count <= 0:
                return None  # ``gpu`` or ``auto``: counted on the node, not known here
            if rank < first + count:
                return int(planned.node_rank)
            first += count
        return None

    def nodes(self) -> list[dict[str, Any]]:
        """Every node that has curves by time: its GPUs and ranks counted (what a page can ask for)."""
        found: dict[int, dict[str, Any]] = {}
        for node, host, _gpu in self.gpus:
            entry = found.setdefault(node, {"node": node, "host": host, "gpus": 0, "ranks": 0})
            entry["gpus"] += 1
        for rank in self.rank_time:
            node = self.node_of(rank)
            if node is not None:
                entry = found.setdefault(node, {"node": node, "host": self.heat.where.get(rank, (None, None))[1],
                                                "gpus": 0, "ranks": 0})
                entry["ranks"] += 1
        return [found[n] for n in sorted(found)]

    def to_json(self, nodes: Optional[Iterable[int]] = None, *, page: bool = False) -> dict[str, Any]:
        """The charts' data: curves by step, the heat map, each rank's and GPU's figures by time.
        ``nodes``: the curves by time of those nodes only (the rest: ``node_json``); ``page``: only
        what a page draws of a GPU (its SM clock and when it was slowed, not its other figures)."""
        train = {key: series.to_json() for key, series in self.train.items()}
        return {"train": train, "val": self.val.to_json(), "heat": self.heat.to_json(), "nodes": self.nodes(),
                **self._by_time(None if nodes is None else set(nodes), page, unplaced=True)}

    def node_json(self, node: int, *, page: bool = False) -> dict[str, Any]:
        """One node's curves by time (``rank_time`` and ``gpus`` as ``to_json`` has them)."""
        return {"node": node, **self._by_time({node}, page)}

    def _by_time(self, nodes: Optional[set[int]], page: bool, unplaced: bool = False) -> dict[str, Any]:
        """``unplaced``: with the ranks whose node is not known here (their page places them)."""
        def gpu_json(series: dict[str, Buckets]) -> dict[str, Any]:
            if not page:
                return {name: s.to_json(extremes=name == "sm_mhz") for name, s in series.items()}
            return {"sm_mhz": series["sm_mhz"].to_json(), "slowed": {"y": _rounded(series["slowed"].means())}}

        ranks = [(rank, series) for rank, series in sorted(self.rank_time.items())
                 if nodes is None or (node := self.node_of(rank)) in nodes or (unplaced and node is None)]
        return {
            "rank_time": [{"rank": rank, "node": self.heat.where.get(rank, (None, None))[0],
                           "host": self.heat.where.get(rank, (None, None))[1], **series.to_json()}
                          for rank, series in ranks],
            "gpus": [{"node": node, "host": host, "gpu": gpu, "sm_max_mhz": self.gpu_top.get((node, host, gpu)),
                      **gpu_json(series)}
                     for (node, host, gpu), series in sorted(self.gpus.items()) if nodes is None or node in nodes],
        }


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
