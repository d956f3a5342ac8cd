"""A Slurm run's output: every node writes node<R>.log into the shared run directory; read or follow them."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ...rundir.lines import LineSplitter, LogLine, ranks_said
from .client import JobState, job_state

POLL_SECONDS = 2.0
_HOST = re.compile(r"^fsdpctl: node (\d+) of \d+ on (\S+)")
Show = Callable[[LogLine], None]


class NodeLogs:
    """Incremental reader of a run directory's node<R>.log files, as lines to show."""

    def __init__(self, run_dir: Path, num_nodes: int):
        self.paths = [run_dir / f"node{rank}.log" for rank in range(num_nodes)]
        self.offsets = [0] * num_nodes
        self.hosts = [f"node{rank}" for rank in range(num_nodes)]
        self.ranks: list[Optional[str]] = [None] * num_nodes
        """The global ranks each node's local rank 0 said it holds (the newest step's)."""
        self.splitters = [LineSplitter(rank, self.hosts[rank], str(path)) for rank, path in enumerate(self.paths)]

    def read_new(self, show: Show, final: bool = False) -> int:
        """Show every complete line written since the last call (``final``: the last one too, newline
        or not); returns how many."""
        count = 0
        for rank, path in enumerate(self.paths):
            try:
                with path.open("rb") as handle:
                    handle.seek(self.offsets[rank])
                    while chunk := handle.read(1 << 16):
                        self.offsets[rank] += len(chunk)
                        count += self._show(rank, self.splitters[rank].feed(chunk), show)
            except FileNotFoundError:
                pass
            if final:
                count += self._show(rank, self.splitters[rank].end(), show)
        return count

    def _show(self, rank: int, lines: list[LogLine], show: Show) -> int:
        for line in lines:
            if match := _HOST.match(line.text):  # the node names itself in its first line
                self.hosts[rank] = self.splitters[rank].host = match.group(2)
                self.ranks[rank] = None  # a new step (a spare in its place): its ranks are said again
            elif said := ranks_said(line):
                self.ranks[rank] = said
            if line.host != self.hosts[rank]:
                line = line._replace(host=self.hosts[rank])
            show(line)
        return len(lines)


class NodeLogsTail:
    """A Slurm run's node logs as a live view reads them (``Backend.log_tail``): each long log from
    its newest ``start_back`` bytes (its first line, where the node names its host, read first)."""

    def __init__(self, run_dir: Path, num_nodes: int, start_back: int = 256 << 10):
        self.logs = NodeLogs(run_dir, num_nodes)
        self.start_back = start_back
        self.started = False

    def pending(self) -> bool:
        for rank, path in enumerate(self.logs.paths):
            try:
                if path.stat().st_size != self.logs.offsets[rank]:
                    return True
            except OSError:
                continue
        return False

    def read_new(self) -> list[LogLine]:
        if not self.started:
            self.started = True
            for rank, path in enumerate(self.logs.paths):
                self._start_near_end(rank, path)
        found: list[LogLine] = []
        self.logs.read_new(found.append)
        return found

    def _start_near_end(self, rank: int, path: Path) -> None:
        try:
            with path.open("rb") as handle:
                size = path.stat().st_size
                if size <= self.start_back:
                    return
                first = handle.readline(4096).decode("utf-8", "replace")
                if match := _HOST.match(first):
                    self.logs.hosts[rank] = self.logs.splitters[rank].host = match.group(2)
                handle.seek(size - self.start_back)
                handle.readline()  # the rest of a line cut by the seek
                self.logs.offsets[rank] = handle.tell()
        except OSError:
            return


def follow(run_dir: Path, num_nodes: int, job_id: str, show: Show, requeueable: bool = False,
           give_up: Callable[[], bool] = lambda: False, leave: Optional[threading.Event] = None,
           on_state: Callable[[JobState, NodeLogs], None] = lambda state, logs: None) -> Optional[JobState]:
    """Show the node logs as they grow until Slurm says the job has ended (a requeued job goes on).
    ``give_up`` is asked after each read; once it says so (it cancelled the job) the job's end is
    awaited. ``on_state`` hears Slurm's word on the job after each read. None when ``leave`` was set
    first (the job goes on)."""
    logs = NodeLogs(run_dir, num_nodes)
    while leave is None or not leave.is_set():
        logs.read_new(show)
        if give_up():
            requeueable = False  # a cancelled job is over, whatever its requeue setting
        state = job_state(job_id, requeueable)
        on_state(state, logs)
        if state.finished:
            time.sleep(0.5)  # the nodes' last writes
            logs.read_new(show, final=True)
            return state
        if leave is not None:
            leave.wait(POLL_SECONDS)
        else:
            time.sleep(POLL_SECONDS)
    return None
