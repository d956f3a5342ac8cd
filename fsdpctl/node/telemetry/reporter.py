"""The thread that turns a rank's finished steps into rows, once a second (at the same instant on
every rank), and appends them to its node's telemetry file (one write per batch of rows, so the
ranks of a node never interleave within a line). Nothing of it runs on the training thread but the
steps' hand-over (a deque)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Optional

from ..events import STEPS_UNSEEN, append_line, event_row
from ..profiling import step_ended as profile_step
from .device import GpuStepTimes, NcclTimes, nccl_entries, resolve
from .patches import Patches
from .steps import Step, StepTracker
from .windows import Windows, window_row

PERIOD_S = 1.0
LOSS_WAIT_S = 30.0
"""How long a step waits for its loss to reach the host before it is written without one."""
CLOSE_WAIT_S = 3.0
"""At the program's end, how long the device is given to finish the steps' marks and losses (a rank
whose peer died may never finish its last collective: its exit is not held up for it)."""
POLL_S = 0.005
UNSEEN_AFTER = 16
"""Backward calls with no step end seen, after which a rank says its steps are out of the hook's sight."""


def rss_peak_mb() -> Optional[float]:
    """This process's high-water resident set (VmHWM), in MB."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


class Reporter:
    """Rows of one rank into ``path``."""

    def __init__(self, tracker: StepTracker, patches: Patches, path: str, place: Mapping[str, Any], *,
                 torch: Any, tokens_per_step: Optional[float] = None, flops_per_token: Optional[float] = None,
                 nccl_timing: bool = False, world: int = 1, clock: Callable[[], float] = time.monotonic):
        self.tracker, self.patches, self.path, self.place = tracker, patches, path, dict(place)
        self.torch = torch
        self.tokens_per_rank = tokens_per_step / max(1, world) if tokens_per_step else None
        self.flops_per_token = flops_per_token
        self.peak_flops: Optional[float] = None
        self.nccl_timing = nccl_timing
        self.clock = clock
        self.windows = Windows()
        self.waiting: list[tuple[Step, float]] = []  # taken from the tracker, loss not yet on the host
        self.losses: dict[int, Optional[float]] = {}
        self.backend: Optional[str] = None
        self.gpu_times: Optional[GpuStepTimes] = None
        self.device_index = 0
        self.cuda: Optional[bool] = None
        self.nccl = NcclTimes() if nccl_timing else None
        self.pid = os.getpid()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.said_unseen = False
        self.thread: Optional[threading.Thread] = None

    # ---- the thread ------------------------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="fsdpctl-telemetry", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # Woken at each whole second of the wall clock, on every rank alike: a rank held up while
        # this thread has the GIL holds up every other at the next collective, so the ranks' pauses
        # had better fall together (once a second for the job) than one after another (N a second).
        while not self.stopped.wait(PERIOD_S - time.time() % PERIOD_S):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - the program goes on without its rows
                self.patches.fail(exc)
                return

    def close(self) -> None:
        """At the program's end: everything left, the last window too (what the device has not done
        within ``CLOSE_WAIT_S`` goes out without it)."""
        if os.getpid() != self.pid or self.patches.off:
            return
        self.stopped.set()
        try:
            self._settle(time.monotonic() + CLOSE_WAIT_S)
            self.flush(final=True)
        except Exception as exc:  # noqa: BLE001
            self.patches.fail(exc)

    def _settle(self, deadline: float) -> None:
        """Wait, polling, until the device has passed every step mark and loss copy, or ``deadline``."""
        def events() -> list[Any]:
            found = [event for _, event in self.gpu_times.pending] if self.gpu_times is not None else []
            losses = [step.loss for step in self.tracker.done] + [step.loss for step, _ in self.waiting]
            return found + [loss.event for loss in losses if loss is not None and not isinstance(loss, float)]

        waiting = events()
        while waiting and time.monotonic() < deadline:
            waiting = [event for event in waiting if not event.query()]
            if waiting:
                time.sleep(POLL_S)

    def step_ended(self, step: Step) -> None:
        """On the training thread, right after a step ended: the GPU's mark (no wait), and a profile asked
        for (``fsdpctl.node.profiling``: nothing but a test while none is)."""
        torch = self.torch
        if self.backend is None:  # asked here, once: the program may have destroyed its group by the next flush
            self.backend = self._backend()
        if self.cuda is None:
            self.cuda = bool(torch.cuda.is_available())  # asked once: a CPU-only torch says no in a few us
        if self.gpu_times is None and self.cuda and torch.cuda.is_initialized():
            self.gpu_times = GpuStepTimes(torch)
            self.device_index = torch.cuda.current_device()  # the training thread's, not this one's
            if self.flops_per_token:
                from fsdpctl.workload.metrics import device_peak_flops

                self.peak_flops = device_peak_flops(torch.device("cuda", self.device_index))
        if self.gpu_times is not None:
            self.gpu_times.mark(step.number)
        profile_step(step.number)

    # ---- rows ------------------------------------------------------------------------------------
    def flush(self, final: bool = False) -> None:
        with self.lock:
            rows = self._rows(final)
            if rows:
                self._write(rows)

    def _rows(self, final: bool) -> list[dict[str, Any]]:
        done = self.tracker.done
        now = self.clock()
        while done:
            self.waiting.append((done.popleft(), now))
        if self.gpu_times is not None:
            self.gpu_times.read()
        if self.nccl is not None:
            self._read_nccl()
        rows = []
        while self.waiting:
            step, taken = self.waiting[0]
            ready, value = resolve(step.loss)
            if not ready and now - taken < LOSS_WAIT_S and not final:
                break
            if not ready:
                step.loss.abandon()  # written without its loss; the slot is freed once the copy passes
            self.waiting.pop(0)
            self.losses[step.number] = value
            if self.nccl is not None:
                step.comm_s = self.nccl.for_step(step.ended_ns)
            if self.tokens_per_rank is not None:
                step.tokens = int(self.tokens_per_rank)
            rows += [self._row(window) for window in self.windows.add(step)]
        if final and (rest := self.windows.rest()):
            rows.append(self._row(rest))
        backward = self.tracker.backward
        if not self.said_unseen and self.tracker.number == 0 and (backward >= UNSEEN_AFTER or final and backward):
            # Backward calls, and no optimizer step ever ended: the program's step runs inside
            # torch.compile (its hooks pass through there), or its optimizer is none of torch's.
            self.said_unseen = True
            rows.append(event_row(STEPS_UNSEEN, backward=backward, **self.place))
        return rows

    def _row(self, window: list[Step]) -> dict[str, Any]:
        extra: dict[str, Any] = {"attempt": int(os.environ.get("FSDPCTL_ATTEMPT", "1") or 1)}
        comm_seen = False
        if self.patches.ddp:
            extra["comm"] = "ddp"  # its all-reduce runs in C++: out of sight
        elif self.backend == "nccl":
            if self.nccl is not None:
                comm_seen, extra["comm"] = True, "nccl"  # kernel times, overlapped ones included
            else:
                extra["comm"] = "nccl-untimed"
        elif self.backend is not None:
            comm_seen, extra["comm"] = True, "waited"
        if any(s.tokens for s in window):
            extra["tokens"] = "declared" if self.tokens_per_rank is not None else "estimated"
        mem = self._memory_mb()
        if mem is not None:
            extra["mem_mb"] = round(mem, 1)
            if self.patches.peak_reset:
                extra["mem_since_reset"] = True
        if self.gpu_times is not None:
            times = [t for s in window if (t := self.gpu_times.take(s.number)) is not None]
            if times:
                extra["gpu_step_s"] = round(sum(times) / len(times), 6)
        if self.tracker.skipped:
            extra["skipped_steps"] = self.tracker.skipped
        losses = [self.losses.pop(s.number, None) for s in window]
        row = window_row(window, losses, self.place, comm_seen=comm_seen, extra=extra)
        if self.peak_flops and self.flops_per_token and row.get("tokens_per_s"):
            row["mfu"] = round(row["tokens_per_s"] * self.flops_per_token / self.peak_flops, 4)
        return row

    def _backend(self) -> Optional[str]:
        """The default process group's backend, once one is up (None before)."""
        dist = self.torch.distributed
        if not dist.is_available() or not dist.is_initialized():
            return None
        return "nccl" if "nccl" in str(dist.get_backend()).lower() else "gloo"

    def _memory_mb(self) -> Optional[float]:
        torch = self.torch
        if self.gpu_times is not None:
            return torch.cuda.max_memory_allocated(self.device_index) / 2**20
        return rss_peak_mb()

    def _read_nccl(self) -> None:
        c10d = self.torch._C._distributed_c10d
        dump = getattr(c10d, "_dump_nccl_trace", None)
        if dump is None or self.backend != "nccl":
            return
        self.nccl.add(nccl_entries(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)))

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if os.getpid() != self.pid:
            return  # a forked child: the rank's rows are the rank's
        append_line(self.path, "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows))
