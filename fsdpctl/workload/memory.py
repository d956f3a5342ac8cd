"""A training step's peak allocated memory on this rank, measured, and fsdpctl's estimate beside it.

What is measured is the allocator's own count, never the estimator's tracker: on a GPU,
``torch.cuda.max_memory_allocated`` over step 2 (its peak reset as step 2 starts); on a CPU, the
allocator's own count of the bytes it holds ("Total Allocated" on each memory event recorded by
``torch.profiler`` with ``profile_memory``, counted from before the model exists), its highest point
within step 2. Not a running sum of the events' sizes: a tensor freed by a thread the profiler does
not record (gloo's, when its work ends) leaves no event, and such a sum kept 15-29 MiB of freed
communication buffers of the small preset. Step 2 is the one the estimate traces too: the
optimizer's states exist from step 1 on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Optional

import torch

from .trace_process import answers, trace_in_process

STEP = 2
"""The step measured (1-based), as the estimator measures its second step."""
MARK = "fsdpctl.memory.step"


class StepMemory:
    """Measures step ``STEP``'s peak allocated bytes on this rank (``peak_bytes``; None: not measured)."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device, self.enabled = device, enabled
        self.peak_bytes: Optional[int] = None
        self.profiler = None
        self.mark = None
        if enabled and device.type != "cuda":
            from torch.profiler import ProfilerActivity, profile

            self.profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self.profiler.start()

    @property
    def measured_by(self) -> Optional[str]:
        if self.peak_bytes is None:
            return None
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated"
        return "the CPU allocator's Total Allocated (torch.profiler)"

    def step_starting(self, step: int) -> None:
        """Before step ``step`` (1-based) runs."""
        if not self.enabled or step != STEP:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.profiler is not None:
            self.mark = torch.profiler.record_function(MARK)
            self.mark.__enter__()

    def step_done(self, step: int) -> None:
        """After step ``step`` (1-based), its gradients freed."""
        if not self.enabled or step != STEP:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        elif self.profiler is not None and self.mark is not None:
            self.mark.__exit__(None, None, None)
            self.profiler.stop()
            self.peak_bytes = allocator_peak(trace_events(self.profiler), MARK)
            self.profiler = self.mark = None

    def close(self) -> None:
        """Stop a profiler still recording (a run shorter than ``STEP`` steps)."""
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None


def trace_events(profiler) -> list[dict[str, Any]]:
    """The profiler's events as its Chrome trace writes them: only there do memory events carry the
    allocator's own count."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as handle:
            return json.load(handle).get("traceEvents", [])


def allocator_peak(events: list[dict[str, Any]], mark: str) -> Optional[int]:
    """The CPU allocator's highest count of bytes held ("Total Allocated") inside the range named
    ``mark``; None when the range is not among the events."""
    window = next(((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                   if e.get("name") == mark and e.get("ph") == "X"), None)
    if window is None:
        return None
    held = [e["args"]["Total Allocated"] for e in events
            if e.get("name") == "[memory]" and window[0] <= e.get("ts", -1) <= window[1]
            and e.get("args", {}).get("Device Type", 0) == 0 and "Total Allocated" in e.get("args", {})]
    return int(max(held)) if held else None


def estimate_step(request: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """fsdpctl's estimate of the same step, traced in a process of its own."""
    try:
        done = trace_in_process(request, timeout, [p for p in sys.path if p])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"the estimate did not run: {exc}"}
    found = answers(done.stdout)
    if not found:
        return {"error": f"the estimate failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"}
    return found[-1]


def report_line(measured: list[int], estimate: dict[str, Any]) -> str:
    """``Memory: ...`` for the run's end: the measured peak (highest rank) against the estimate."""
    high = max(measured)
    text = f"Memory: one training step's peak allocated per rank: measured {high / 2**20:.1f} MiB"
    if estimate.get("peak_bytes") and estimate.get("traced"):
        off = (estimate["peak_bytes"] - high) / high * 100
        return (f"{text}, estimated {estimate['peak_bytes'] / 2**20:.1f} MiB ({off:+.1f}%) | "
                f"mem_measured={high} mem_estimated={estimate['peak_bytes']}")
    why = estimate.get("error") or "not traced"
    return f"{text}; no estimate ({why}) | mem_measured={high}"
