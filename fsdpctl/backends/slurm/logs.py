"""A Slurm run's output: every node writes node<R>.log into the shared run directory; read or follow them."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ...rundir.lines import LogLine
from .client import JobState, job_state

POLL_SECONDS = 2.0
_HOST = re.compile(r"^fsdpctl: node (\d+) of \d+ on (\S+)")
Show = Callable[[LogLine], None]


class NodeLogs:
    """Incremental reader of a run directory's node<R>.log files."""

    def __init__(self, run_dir: Path, num_nodes: int):
        self.paths = [run_dir / f"node{rank}.log" for rank in range(num_nodes)]
        self.offsets = [0] * num_nodes
        self.partial = [""] * num_nodes
        self.hosts = [f"node{rank}" for rank in range(num_nodes)]

    def read_new(self, show: Show) -> int:
        """Show every complete line written since the last call; returns how many."""
        count = 0
        for rank, path in enumerate(self.paths):
            try:
                with path.open("rb") as handle:
                    handle.seek(self.offsets[rank])
                    data = handle.read()
            except FileNotFoundError:
                continue
            self.offsets[rank] += len(data)
            text = self.partial[rank] + data.decode("utf-8", "replace")
            *lines, self.partial[rank] = text.split("\n")
            for line in lines:
                if match := _HOST.match(line):  # the node names itself in its first line
                    self.hosts[rank] = match.group(2)
                show(LogLine.of(rank, self.hosts[rank], line))
                count += 1
        return count


def follow(run_dir: Path, num_nodes: int, job_id: str, show: Show, requeueable: bool = False,
           give_up: Callable[[], bool] = lambda: False, leave: Optional[threading.Event] = None
           ) -> Optional[JobState]:
    """Show the node logs as they grow until Slurm says the job has ended (a requeued job goes on).
    ``give_up`` is asked after each read; once it says so (it cancelled the job) the job's end is
    awaited. None when ``leave`` was set first (the job goes on)."""
    logs = NodeLogs(run_dir, num_nodes)
    while leave is None or not leave.is_set():
        logs.read_new(show)
        if give_up():
            requeueable = False  # a cancelled job is over, whatever its requeue setting
        state = job_state(job_id, requeueable)
        if state.finished:
            time.sleep(0.5)  # the nodes' last writes
            logs.read_new(show)
            return state
        if leave is not None:
            leave.wait(POLL_SECONDS)
        else:
            time.sleep(POLL_SECONDS)
    return None
