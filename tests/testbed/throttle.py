"""Slowing one rank of a testbed run for real, whatever else loads the machine."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path


class Throttle:
    """Holds one rank of a lab's runs off the CPU for ``held`` of the time, by its PID (SIGSTOP, then
    SIGCONT, in periods of 60 ms: 30 ms each by default) until it exits, as a throttled device or a noisy
    neighbour would, whatever else loads this machine; always leaves it running. The rank: the process
    running ``module`` with ``RANK=rank`` in its environment, in a run directory under ``lab_root``."""

    PERIOD_S = 0.06

    def __init__(self, lab_root: Path, rank: int, module: str = "fsdpctl.workload.train", held: float = 0.5):
        self.stopped_s, self.running_s = self.PERIOD_S * held, self.PERIOD_S * (1 - held)
        self.module = module.encode()
        self.marks = (f"RANK={rank}".encode(), f"FSDPCTL_RUN_DIR={lab_root}".encode())
        self.pid: int | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _find(self) -> int | None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if self.module in cmdline and self.marks[0] in environ and any(
                    e.startswith(self.marks[1]) for e in environ):
                return int(entry.name)
        return None

    def _run(self) -> None:
        while not self.done.is_set() and self.pid is None:
            self.pid = self._find()
            self.done.wait(0.1)
        while self.pid is not None and not self.done.is_set():
            try:
                os.kill(self.pid, signal.SIGSTOP)
                self.done.wait(self.stopped_s)
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            self.done.wait(self.running_s)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
