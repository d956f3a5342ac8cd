"""What the dashboard's open pages share: one watcher per run being looked at (its live-run model and
its charts, read from the run's directory here as they grow), one over the registry, and the newest
payload of each, versioned, for every page's event stream to wait on. Twenty pages on one run cost
one watcher; a watcher nobody has asked for in a while stops.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from .data import RunsIndex, run_page

POLL_SECONDS = 0.5
"""How often a watched run's files are looked at (a few stat calls)."""
CHARTS_SECONDS = 2.0
"""How often a live run's charts are sent again at the most (they are the bulk of a page's data)."""
RUNS_SECONDS = 2.0
IDLE_SECONDS = 60.0
"""A watcher nobody asked for this long stops (a page asks again when it opens)."""


class Payload:
    """The newest data of one page, versioned; readers wait for a version newer than theirs."""

    def __init__(self) -> None:
        self.version = 0
        self.data: Optional[dict[str, Any]] = None
        self.changed = threading.Condition()
        self.asked_at = time.monotonic()

    def publish(self, data: dict[str, Any]) -> None:
        with self.changed:
            self.version += 1
            self.data = data
            self.changed.notify_all()

    def wait_newer(self, version: int, timeout: float) -> tuple[int, Optional[dict[str, Any]]]:
        """The data once newer than ``version`` (or as it is after ``timeout`` seconds)."""
        self.asked_at = time.monotonic()
        with self.changed:
            self.changed.wait_for(lambda: self.version > version, timeout)
            return self.version, self.data


class RunWatcher:
    """One run's page data, kept current by a thread of its own."""

    def __init__(self, run: Any, on_stop: Callable[[], None]):
        from ..live.charts import ChartStore
        from ..live.model import LiveRun

        self.run = run
        backend = run.backend
        self.live = LiveRun(run._dir, backend.log_tail, backend.scheduler_status)
        self.charts = ChartStore(run.path, run.plan, run.plan.world_size)
        self.charts_lock = threading.Lock()  # the watcher's thread updates them; a page's request reads a node's
        self.payload = Payload()
        self.on_stop = on_stop
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"fsdpctl-web-{run.run_id}", daemon=True)

    def start(self) -> RunWatcher:
        self._publish(charts=True)
        self.thread.start()
        return self

    def _publish(self, charts: bool) -> None:
        snapshot = self.live.snapshot()
        if charts or self.payload.data is None:
            with self.charts_lock:
                if self.live.run.plan is not self.charts.plan:  # a new attempt: its plan (nodes) with the same charts
                    self.charts.plan = self.live.run.plan
                first = self.charts.index_loaded is None
                self.charts.update()
                if first and not self.charts.index_loaded:
                    self.charts.save_index()  # read from the files once: the next look starts from here
                chart_data = self.charts.to_json(first_nodes(snapshot), page=True)
        else:
            chart_data = self.payload.data.get("charts")
        self.payload.publish({**run_page(self.live.run, snapshot.to_json(), self._goodput()), "charts": chart_data})

    def _goodput(self) -> Optional[dict[str, Any]]:
        """Where the run's time went so far (``fsdpctl.accounting.cache``: counted again when due)."""
        from ..accounting.cache import counted_json
        from ..api.run import Run

        return counted_json(Run(self.live.run))

    def node_charts(self, node: int) -> dict[str, Any]:
        """One node's curves by time, as they stand (a page asks as the node comes into view)."""
        with self.charts_lock:
            return self.charts.node_json(node, page=True)

    def _loop(self) -> None:
        charts_at = time.monotonic()
        over = False
        while not self.stop.wait(POLL_SECONDS):
            if time.monotonic() - self.payload.asked_at > IDLE_SECONDS:
                break
            if over or not self.live.changed():
                continue
            due = time.monotonic() - charts_at >= CHARTS_SECONDS
            try:
                self._publish(charts=due)
            except (OSError, ValueError):
                continue  # a file being replaced under us: the next look reads it whole
            if due:
                charts_at = time.monotonic()
            over = bool(self.payload.data and self.payload.data["snapshot"]["run"]["state"] in _OVER)
            if over:
                self._publish(charts=True)
        self.stop.set()
        self.on_stop()


FIRST_NODES = 2
"""Nodes whose curves by time come with a run's page (the first ones, and the straggler's): the rest
come when the page shows them (``Hub.node_charts``), so a 16-node page weighs what a 2-node one does."""


def first_nodes(snapshot: Any) -> set[int]:
    """The nodes a page's first view draws: the first ``FIRST_NODES`` and the straggler's."""
    nodes = {node.node_rank for node in snapshot.nodes[:FIRST_NODES]} or set(range(FIRST_NODES))
    straggler = snapshot.straggler or {}
    if isinstance(straggler.get("node"), int):
        nodes.add(straggler["node"])
    return nodes


_OVER = {"succeeded", "failed", "stopped", "interrupted", "timeout", "cancelled", "node_fail", "preempted",
         "out_of_memory"}


class Hub:
    """The dashboard's watchers, by run id, and the registry's."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = runs_dir
        self.index = RunsIndex(runs_dir)
        self.runs = Payload()
        self.watchers: dict[str, RunWatcher] = {}
        self.lock = threading.Lock()
        self.runs_thread: Optional[threading.Thread] = None
        self.closing = threading.Event()

    def runs_payload(self) -> Payload:
        """The registry's rows, kept current while pages ask for them."""
        with self.lock:
            if self.runs_thread is None or not self.runs_thread.is_alive():
                self.runs.publish({"runs": self.index.listing()})
                self.runs_thread = threading.Thread(target=self._runs_loop, name="fsdpctl-web-runs", daemon=True)
                self.runs_thread.start()
        return self.runs

    def _runs_loop(self) -> None:
        last = self.runs.data
        while not self.closing.wait(RUNS_SECONDS):
            if time.monotonic() - self.runs.asked_at > IDLE_SECONDS:
                return
            rows = {"runs": self.index.listing()}
            if rows != last:
                self.runs.publish(rows)
                last = rows

    def _watcher(self, run: Any) -> RunWatcher:
        """``run``'s watcher, started when nobody watched it."""
        with self.lock:
            watcher = self.watchers.get(run.run_id)
            if watcher is None or watcher.stop.is_set():
                watcher = RunWatcher(run, lambda rid=run.run_id: self._forget(rid))
                self.watchers[run.run_id] = watcher
                watcher.start()
            watcher.payload.asked_at = time.monotonic()
            return watcher

    def run_payload(self, run: Any) -> Payload:
        """``run``'s page data."""
        return self._watcher(run).payload

    def node_charts(self, run: Any, node: int) -> dict[str, Any]:
        """One node's curves by time of ``run``."""
        return self._watcher(run).node_charts(node)

    def _forget(self, run_id: str) -> None:
        with self.lock:
            watcher = self.watchers.get(run_id)
            if watcher is not None and watcher.stop.is_set():
                self.watchers.pop(run_id, None)

    def close(self) -> None:
        self.closing.set()
        with self.lock:
            for watcher in self.watchers.values():
                watcher.stop.set()
