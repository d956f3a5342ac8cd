"""A run's figures over its whole length for charts (the dashboard, ``report --html``) and its report,
in bounded memory however long the run (``chart_series``: no chart draws more than a thousand points,
100,000 steps or a week of GPU samples alike).

``ChartStore`` reads a run's metrics copies and GPU samples as they grow (new bytes only; a file of
more than ``SEED_BYTES`` when first seen is sampled for its history, so a page opens at once on a run
of days) into: the training and validation curves by step; each rank's compute time by window (the
heat map) and by wall time; each GPU's SM clock by wall time and when a slowdown reason was active;
and the report's figures (``fsdpctl.metrics.fold``, ``GpuFold``). The run's chart index
(``chart_index``) keeps all of it between readers.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from ..metrics.fold import Fold
from ..metrics.gpu_samples import GpuFold
from . import layout
from .chart_series import Buckets, HeatMap, rounded
from .copies import CopyReader
from .metrics_feed import MetricsFeed
from .tails import LineTail

GPU_FIGURES = ("sm_mhz",)
"""A GPU's figures kept by time: its SM clock (with when it was slowed, what a straggler's cause shows).
Its utilisation, temperature, power and memory are shown as they are now (the node table) and go to
the exports whole; kept here too they would triple the charts' size for curves no page draws."""


class ChartStore:
    """One run's chart data, brought up to date from its files here (``update``); ``to_json`` is what
    a page draws. A consumer of a ``CopyReader``: its own, or one it shares with the run's other
    consumers (the collector's, which the exports read from too)."""

    def __init__(self, root: Path, plan: Any, world_size: Optional[int] = None,
                 sources: Optional[tuple[list[Path], list[Path]]] = None, use_index: bool = True,
                 reader: Optional[CopyReader] = None, whole: bool = False):
        """``sources``: the metrics and GPU sample files to read (default: the run's, as ``layout``
        finds them); ``use_index``: begin from the run's chart index (``chart_index``) when it is
        usable, read only what the files gained after it; ``reader``: the reader to take rows from
        (it reads the files; the store is added to it); ``whole``: read every file whole, a long
        one's history too (a report of a finished run), instead of sampling it."""
        self.root, self.plan, self.sources = root, plan, sources
        self.world_size = world_size
        self.use_index = use_index
        self.index_loaded: Optional[bool] = None
        """Whether the index was used (None: not looked for yet)."""
        self.reader = reader if reader is not None else CopyReader(self.files, world_size, seed=not whole)
        self.reader.add(self)
        self.reset()

    def reset(self) -> None:
        """Forget everything read (the files are read again from their start)."""
        self.reader.reset()
        self.train = {key: Buckets() for key in ("loss", "tokens_per_s", "mfu", "step_time_s")}
        self.val = Buckets()
        self.heat = HeatMap()
        self.rank_time: dict[int, Buckets] = {}
        self.gpus: dict[tuple[int, str, str], dict[str, Buckets]] = {}
        self.gpu_top: dict[tuple[int, str, str], float] = {}
        self.last_sample: dict[tuple[int, str], float] = {}
        self.fold = Fold()
        """The report's figures, folded from the same rows (``fsdpctl.metrics.fold``)."""
        self.gpu_fold = GpuFold()

    # The reader's state, which the chart index keeps with the charts.
    @property
    def feed(self) -> MetricsFeed:
        return self.reader.feed

    @property
    def metric_tails(self) -> dict[Path, LineTail]:
        return self.reader.metric_tails

    @property
    def gpu_tails(self) -> dict[Path, LineTail]:
        return self.reader.gpu_tails

    @property
    def sampled(self) -> bool:
        """A file's history was sampled, not read whole: the charts stand for it in outline."""
        return self.reader.sampled

    @sampled.setter
    def sampled(self, value: bool) -> None:
        self.reader.sampled = value

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

    def load_index(self) -> bool:
        """Begin from the run's chart index, once, before anything is read (when ``use_index``)."""
        if self.index_loaded is None:
            self.index_loaded = False
            if self.use_index:
                from .chart_index import load

                metrics, gpus = self.files()
                self.index_loaded = load(self, self.index_path, metrics, gpus)
        return self.index_loaded

    def update(self) -> bool:
        """Read what the files gained (the first time: from where the run's chart index stops, when
        it is usable); True when anything came."""
        came = self.load_index()
        return self.reader.update() or came

    # ---- the reader's consumer -------------------------------------------------------------------
    def row(self, kind: str, row: dict[str, Any]) -> None:
        self.fold.add(kind, row)
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
                    rank = int(entry.get("rank", 0))
                    series = self.rank_time.get(rank)
                    if series is None:  # (made once: every row names every rank)
                        series = self.rank_time[rank] = Buckets()
                    series.add(when, _number(entry.get("compute_s")))

    def event(self, row: dict[str, Any]) -> None:
        """A rank's event row: what the report says of it (``Fold.event``)."""
        self.fold.event(row)

    def attempt_began(self, from_step: int) -> None:
        """A later attempt resumed from ``from_step``: the curves by step drop what it trains again."""
        self.fold.truncate(from_step)
        for series in (*self.train.values(), self.val):
            series.drop_after(from_step)
        self.heat.drop_after(from_step)

    def samples(self, samples: list[dict[str, Any]]) -> None:
        for sample in samples:
            node, host, t = sample["node"], str(sample.get("host") or ""), _number(sample.get("t"))
            if t is None or t <= self.last_sample.get((node, host), float("-inf")):
                continue  # read again, or out of order
            self.last_sample[(node, host)] = t
            self.gpu_fold.add(sample)
            for gpu in sample.get("gpus") or ():
                key = (node, host, str(gpu.get("index")))
                series = self.gpus.get(key)
                if series is None:
                    series = self.gpus[key] = {name: Buckets() for name in (*GPU_FIGURES, "slowed")}
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
            return {"sm_mhz": series["sm_mhz"].to_json(), "slowed": {"y": rounded(series["slowed"].means())}}

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
