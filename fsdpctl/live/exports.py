"""A run's numbers written where users keep theirs, from the copies here as they grow, by the process
that collects the run (no line of user code, nothing asked of the nodes): TensorBoard event files
(every metrics row by step; every GPU sample by seconds since the run began) and a Prometheus
textfile with the newest values under DCGM-Exporter's GPU metric names, so public Grafana GPU
dashboards read it unchanged. ``report --tensorboard`` writes the same for a finished run.

The writers' libraries (tensorboardX and google-crc32c, prometheus_client: the ``export`` extra) are
imported only for a run whose plan asks for that export; where one is missing, the run goes on and
the problem says which extra to install."""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..accounting.cache import due as goodput_due
from ..errors import UsageError
from ..rundir.paths import read_json, write_json_atomic
from ..rundir.record import epoch
from ..rundir.rundir import RunDir
from . import layout
from .copies import CopyReader
from .metrics_feed import MetricsFeed

if TYPE_CHECKING:
    from ..export.prometheus import Family
    from ..export.tensorboard import EventWriter

INSTALL = "pip install 'fsdpctl[export]'"
"""What puts the writers' libraries here."""
EXPORTED = "exported.json"
"""How far the exports have read each copy (``live/``): a later exporter of the run goes on from there."""
EVERY_SECONDS = 5.0
"""How often the exports are brought up to date while a run goes (TensorBoard reads its files every 5 s
or more; Prometheus scrapes every 15 s or so); the collector reads the copies for them as often."""
PROMETHEUS_SECONDS = 15.0
"""How often the textfile is written again: Prometheus scrapes every 15 s or so (DCGM-Exporter itself
collects every 30 s by default); each write renders every GPU's and rank's figures (about 12 ms at 16 x 8
GPUs), so writing it more often than it is read costs the launcher for nothing."""
GOODPUT_SECONDS = 300.0
"""How often the exports count the run's goodput again while it goes, at the least; and never more often
than keeps counting under ``GOODPUT_SHARE`` of the time. The account reads every row of the run: at 64
nodes two minutes in, 0.3 s of the launcher's CPU, what the whole launcher spends in 3 s; every 30 s
(the views' pace) it was the largest part of what the exports cost. Its figures move by the minute."""
GOODPUT_SHARE = 0.01
RANK_FIGURES = (("compute_s", "compute_s", "fsdpctl_rank_compute_seconds", "Seconds of compute per step"),
                ("comm_s", "collective_s", "fsdpctl_rank_collective_seconds",
                 "Seconds per step waiting on collectives not hidden behind compute"),
                ("data_s", "data_s", "fsdpctl_rank_data_seconds", "Seconds per step waiting for data"),
                ("mem_mb", "memory_mb", "fsdpctl_rank_memory_megabytes", "Peak memory of the rank (MB)"))
RUN_FIGURES = (("loss", "loss/train", "fsdpctl_loss", "Training loss of the newest logged step"),
               ("tokens_per_s", "throughput/tokens_per_s", "fsdpctl_tokens_per_second", "Tokens per second, all ranks"),
               ("mfu", "throughput/mfu", "fsdpctl_mfu_ratio", "Model FLOPs utilisation (0-1)"),
               ("step_time_s", "time/step_s", "fsdpctl_step_time_seconds", "Seconds per step (newest window)"),
               ("lr", "optimizer/lr", "fsdpctl_learning_rate", "Learning rate"))
# DCGM-Exporter's names and units for what the GPU samples hold (its default counters' set).
GPU_FIGURES = (("sm_mhz", "sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
               ("util_pct", "util_pct", "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
               ("temp_c", "temp_c", "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
               ("power_w", "power_w", "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
               ("mem_mib", "mem_used_mib", "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
               ("ecc_uncorrected", "ecc_uncorrected", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "Total number of double-bit volatile ECC errors."))
# NVML's clock event reasons, as DCGM_FI_DEV_CLOCK_THROTTLE_REASONS carries them (a bit mask).
REASON_BITS = {"SW power cap": 0x4, "HW slowdown": 0x8, "SW thermal slowdown": 0x20, "HW thermal slowdown": 0x40,
               "HW power brake": 0x80}


def library_missing(what: str, where: str, module: str) -> Optional[str]:
    """Why the writer of ``what`` (``fsdpctl.export.<module>``) cannot be imported here, naming the extra
    to install; None: it can."""
    try:
        importlib.import_module(f"..export.{module}", __package__)
    except ImportError as exc:
        return f"{what} export to {where}: {exc.name or exc} is not installed here ({INSTALL})"
    return None


def missing_writers(export: Mapping[str, Any]) -> list[str]:
    """What a plan's ``export`` asks for that cannot be written here (said at launch; the follower, which
    writes them, says it again in the run's notes)."""
    wanted = (("TensorBoard", export.get("tensorboard"), "tensorboard"),
              ("Prometheus", export.get("prometheus"), "prometheus"))
    return [said for what, where, module in wanted if where and (said := library_missing(what, where, module))]


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class LiveExports:
    """The exports of one run (its plan's ``export``): a consumer of the run's ``CopyReader`` (the
    collector's, shared with the charts; or its own). ``update`` writes what came (at most every
    ``EVERY_SECONDS`` unless ``force``), ``close`` writes the last of it and removes the textfile."""

    def __init__(self, run: RunDir, *, tensorboard: Optional[str] = None, prometheus: Optional[str] = None,
                 sources: Optional[tuple[list[Path], list[Path]]] = None):
        """``tensorboard``, ``prometheus``: given here instead of the plan's ``export`` (with ``sources``,
        the metrics and GPU sample files to read whole instead of the copies, and nothing kept of how far
        they were written: ``report --tensorboard`` of a finished run)."""
        self.run = run
        self.sources = sources
        export = run.plan.export or {} if sources is None else {}
        tensorboard = tensorboard or export.get("tensorboard")
        prometheus = prometheus or export.get("prometheus")
        self.problems: list[str] = []
        """What could not be written (said once each; the run goes on regardless)."""
        self.writer: Optional[EventWriter] = None
        if tensorboard and self._library("TensorBoard", tensorboard, "tensorboard"):
            from ..export.tensorboard import EventWriter

            try:
                self.writer = EventWriter(Path(tensorboard))
            except OSError as exc:
                self.problems.append(f"TensorBoard export to {tensorboard}: {exc}")
        prometheus_ready = bool(prometheus) and self._library("Prometheus", prometheus, "prometheus")
        self.textfile = Path(prometheus) if prometheus_ready else None
        self.reader: Optional[CopyReader] = None
        self.own_reader = False
        self.gpus: dict[int, dict[str, Any]] = {}
        """Each node's newest GPU sample."""
        self.gpu_tags: dict[tuple[Any, Any], tuple[str, ...]] = {}
        self.updated_at = 0.0
        self.textfile_at = 0.0
        self.goodput: Optional[Any] = None
        """The run's goodput account as last counted (``fsdpctl.accounting``), when (monotonic) and in how
        long (``GOODPUT_SECONDS``: counting it reads every row of the run)."""
        self.goodput_at, self.goodput_took = float("-inf"), 0.0
        self.came = False
        self.written: tuple[int, int, int] = (0, 0, 0)
        """How far the rows written go: (the reader's resets, the newest train step, the newest
        validation step); an exporter that goes on after another skips rows up to there."""
        started = run.record.started_at or run.record.submitted_at or run.record.created_at
        self.began = epoch(started) or time.time()
        if sources is not None:
            self.read_from(CopyReader(lambda: sources, run.plan.world_size, seed=False), own=True)

    def read_from(self, reader: CopyReader, *, own: bool = False) -> None:
        """Take rows and samples from ``reader`` (``own``: this exporter reads it at each ``update``;
        else its owner does, and an earlier exporter of the run may have written some of it)."""
        self.reader, self.own_reader = reader, own
        reader.add(self)
        if self.sources is None:
            saved = read_json(layout.live_dir(self.run.root) / EXPORTED)
            if isinstance(saved.get("written"), list) and len(saved["written"]) == 3:
                self.written = tuple(int(v) for v in saved["written"])
                self.gpus = {int(node): {"t": float(t)} for node, t in (saved.get("gpu_t") or {}).items()}

    def _save(self) -> None:
        state = {"written": list(self.written),
                 "gpu_t": {str(node): _number(sample.get("t")) or 0.0 for node, sample in self.gpus.items()}}
        write_json_atomic(layout.live_dir(self.run.root) / EXPORTED, state, compact=True)

    def _library(self, what: str, where: str, module: str) -> bool:
        """Whether the writer of ``what`` (``fsdpctl.export.<module>``) and its libraries import here; where
        they do not, a problem naming the extra to install (for ``report --tensorboard``, which asks for
        nothing else, an error)."""
        said = library_missing(what, where, module)
        if said is None:
            return True
        if self.sources is not None:
            raise UsageError(said, f"{INSTALL}, or leave out --tensorboard")
        self.problems.append(said)
        return False

    @property
    def active(self) -> bool:
        return self.writer is not None or self.textfile is not None

    @property
    def metrics(self) -> MetricsFeed:
        """The reader's figures (the newest rows, each rank's newest windows)."""
        if self.reader is None:  # on its own: the run's copies, read whole
            plan, root = self.run.plan, self.run.root
            self.read_from(CopyReader(lambda: (layout.metrics_files(root, plan), layout.gpu_files(root, plan)),
                                      plan.world_size, seed=False), own=True)
        return self.reader.feed

    def update(self, *, force: bool = False, state: str = "running") -> None:
        """Write out what came (reading it first where the reader is this exporter's own)."""
        if not self.active or (not force and time.monotonic() - self.updated_at < EVERY_SECONDS):
            return
        self.updated_at = time.monotonic()
        feed = self.metrics
        if self.own_reader:
            self.reader.update()
        if force or goodput_due(self.goodput_at, self.goodput_took, time.monotonic(), GOODPUT_SECONDS, GOODPUT_SHARE):
            began = time.monotonic()
            self._guarded("goodput", self._count_goodput)
            self.goodput_at, self.goodput_took = time.monotonic(), time.monotonic() - began
            if self.writer is not None and self.goodput is not None:
                self._guarded("TensorBoard", lambda: self._goodput_scalars(feed))
        self._guarded("TensorBoard", lambda: self.writer.flush() if self.writer is not None else None)
        due = force or time.monotonic() - self.textfile_at >= PROMETHEUS_SECONDS
        if self.textfile is not None and due:  # scraped every 15 s or so: a few seconds old is current
            self.textfile_at = time.monotonic()
            from ..export.prometheus import render, write_textfile

            self._guarded("Prometheus", lambda: write_textfile(self.textfile, render(self.families(state, feed))))
        if self.sources is None and self.came:
            self.came = False
            self._guarded("export state", self._save)

    def _count_goodput(self) -> None:
        """Where the run's time went so far, counted again (when ``due``: it reads every row)."""
        from ..accounting.cache import account_of_dir

        self.goodput = account_of_dir(self.run)

    def _goodput_scalars(self, feed: MetricsFeed) -> None:
        """The account into TensorBoard at the newest step: ``goodput/*`` and ``badput/<category>_s``."""
        assert self.writer is not None and self.goodput is not None
        values = [(tag, value) for tag, value in (("goodput/ettr", self.goodput.ettr),
                                                  ("goodput/strict", self.goodput.goodput)) if value is not None]
        values += [(f"badput/{name}_s", seconds) for name, seconds in self.goodput.seconds.items()
                   if name != "productive"]
        self.writer.scalars_at(feed.step or 0, values, time.time())

    def close(self) -> None:
        """The last of it; the textfile goes (a finished run is no longer current)."""
        self.update(force=True, state=str(self.run.record.state))
        if self.writer is not None:
            self._guarded("TensorBoard", self.writer.close)
        if self.textfile is not None:
            with contextlib.suppress(OSError):
                self.textfile.unlink()

    def _guarded(self, what: str, action: Any) -> None:
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - an export never stops the run: said once, and the run goes on
            said = f"{what} export: {exc}"
            if said not in self.problems:
                self.problems.append(said)

    # ---- the reader's consumer: TensorBoard ------------------------------------------------------
    def row(self, kind: str, row: dict[str, Any]) -> None:
        resets = self.reader.feed.resets if self.reader is not None else 0
        had, train, val = self.written
        if resets < had:
            return  # an attempt before the one the exporter before this one had got to
        if resets > had:
            train = val = -1  # the steps began again
        step = row["step"]
        if step <= (val if kind == "val" else train):
            return  # written by the exporter before this one (a follower started again), or a step again
        self.written = (resets, train, step) if kind == "val" else (resets, step, val)
        self.came = True
        if self.writer is not None:
            self._guarded("TensorBoard", lambda: self._scalars(kind, row))

    def _scalars(self, kind: str, row: dict[str, Any]) -> None:
        """A row's figures, one event for all of them (``EventWriter.scalars_at``)."""
        step, wall = row["step"], _number(row.get("time"))
        if kind == "val":
            if (value := _number(row.get("val_loss"))) is not None:
                self.writer.scalars_at(step, [("loss/val", value)], wall)
            return
        values = [(tag, value) for key, tag, _, _ in RUN_FIGURES if (value := _number(row.get(key))) is not None]
        for entry in row.get("ranks") or ():
            if isinstance(entry, dict):
                values += [(f"rank{entry.get('rank', 0)}/{name}", value) for key, name, _, _ in RANK_FIGURES
                           if (value := _number(entry.get(key))) is not None]
        self.writer.scalars_at(step, values, wall)

    def attempt_began(self, from_step: int) -> None:
        """A later attempt: its rows are written again from ``from_step`` on (the steps it trains again)."""

    def samples(self, samples: list[dict[str, Any]]) -> None:
        for sample in samples:
            node, t = sample["node"], _number(sample.get("t")) or time.time()
            newest = self.gpus.get(node)
            if newest is not None and (_number(newest.get("t")) or 0) >= t:
                continue  # a sample read again, or written by the exporter before this one
            self.gpus[node] = sample
            self.came = True
            if self.writer is not None:
                self._guarded("TensorBoard", lambda sample=sample, t=t: self._gpu_scalars(sample, t))

    def _gpu_scalars(self, sample: dict[str, Any], t: float) -> None:
        """A node's sample of its GPUs, one event for all their figures (``EventWriter.scalars_at``)."""
        values = []
        for gpu in sample.get("gpus") or ():
            tags = self._gpu_tags(sample["node"], gpu.get("index"))
            values += [(tag, value) for (key, _, _, _), tag in zip(GPU_FIGURES, tags, strict=True)
                       if (value := _number(gpu.get(key))) is not None]
        self.writer.scalars_at(max(0, int(t - self.began)), values, t)

    def _gpu_tags(self, node: Any, index: Any) -> tuple[str, ...]:
        """A GPU's tags, one per figure (made once: every sample of every GPU names them)."""
        tags = self.gpu_tags.get((node, index))
        if tags is None:
            tags = self.gpu_tags[(node, index)] = tuple(f"gpu/node{node}/gpu{index}/{name}"
                                                        for _, name, _, _ in GPU_FIGURES)
        return tags

    # ---- Prometheus ------------------------------------------------------------------------------
    def families(self, state: str = "running", feed: Optional[MetricsFeed] = None) -> list[Family]:
        """The textfile's metrics now: the run's newest figures, each rank's, each GPU's."""
        from ..export.prometheus import Family

        plan, run_id = self.run.plan, self.run.run_id
        base = {"run": run_id}
        feed = feed or self.metrics
        families = [Family("fsdpctl_run_info", "The run (labels) and its state; 1 while it goes.", "gauge",
                           [({**base, "profile": plan.profile_name, "backend": plan.backend, "state": state}, 1.0)])]
        if feed.step is not None:
            families.append(Family("fsdpctl_step", "Newest logged training step.", "gauge", [(base, float(feed.step))]))
        total = plan.train.get("steps") if not plan.command else None
        if isinstance(total, int):
            families.append(Family("fsdpctl_total_steps", "Steps the run trains.", "gauge", [(base, float(total))]))
        for key, _, name, words in RUN_FIGURES:
            if (value := feed.newest(key)) is not None:
                families.append(Family(name, words + ".", "gauge", [(base, value)]))
        if feed.val_loss is not None:
            families.append(Family("fsdpctl_val_loss", "Validation loss, newest.", "gauge", [(base, feed.val_loss)]))
        newest = feed.windows[-1][1] if feed.windows else []
        for key, _, name, words in RANK_FIGURES:
            samples = [({**base, "rank": str(e.get("rank", 0)), "node": str(e.get("node", "")),
                         "host": str(e.get("host", ""))}, value)
                       for e in newest if (value := _number(e.get(key))) is not None]
            if samples:
                families.append(Family(name, words + " in the newest window.", "gauge", samples))
        families += self._gpu_families(base)
        families += self._goodput_families(base)
        return families

    def _goodput_families(self, base: dict[str, str]) -> list[Family]:
        """The run's goodput so far: its two ratios, and its seconds by category outside productive steps."""
        from ..export.prometheus import Family

        account = self.goodput
        if account is None:
            return []
        families = [Family(name, words, "gauge", [(base, value)]) for name, words, value in (
            ("fsdpctl_goodput_ettr", "Time in steps that survived over wall time, so far (ETTR).", account.ettr),
            ("fsdpctl_goodput_ratio", "Productive step time over wall time, so far (strict goodput).", account.goodput))
            if value is not None]
        families.append(Family("fsdpctl_badput_seconds", "Seconds of the run so far in each category outside "
                               "productive steps (fsdpctl.accounting).", "gauge",
                               [({**base, "category": name}, seconds) for name, seconds in account.seconds.items()
                                if name != "productive"]))
        return families

    def _gpu_families(self, base: dict[str, str]) -> list[Family]:
        from ..export.prometheus import Family

        by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for node, sample in sorted(self.gpus.items()):
            host = str(sample.get("host") or "")
            for gpu in sample.get("gpus") or ():
                labels = {**base, "gpu": str(gpu.get("index")), "node": str(node), "host": host, "Hostname": host,
                          "pci_bus_id": str(gpu.get("bus_id") or "")}
                for key, _, name, _ in GPU_FIGURES:
                    if (value := _number(gpu.get(key))) is not None:
                        by_name.setdefault(name, []).append((labels, value))
                used, whole = _number(gpu.get("mem_mib")), _number(gpu.get("mem_total_mib"))
                if used is not None and whole is not None:
                    by_name.setdefault("DCGM_FI_DEV_FB_FREE", []).append((labels, whole - used))
                mask = sum(REASON_BITS.get(reason, 0) for reason in gpu.get("reasons") or ())
                by_name.setdefault("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", []).append((labels, float(mask)))
                by_name.setdefault("DCGM_FI_DEV_ROW_REMAP_PENDING", []).append(
                    (labels, 1.0 if gpu.get("remap_pending") else 0.0))
        words = {name: words for _, _, name, words in GPU_FIGURES}
        words.update(DCGM_FI_DEV_FB_FREE="Framebuffer memory free (in MiB).",
                     DCGM_FI_DEV_CLOCK_THROTTLE_REASONS="Current clock throttle reasons (a bit mask).",
                     DCGM_FI_DEV_ROW_REMAP_PENDING="Row remapping is pending (1: the GPU needs a reset).")
        return [Family(name, words[name], "gauge", samples) for name, samples in by_name.items()]
