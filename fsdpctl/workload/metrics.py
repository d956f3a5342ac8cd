"""Throughput, MFU, memory, and the files a run leaves: ``metrics.jsonl`` and ``summary.json``.

Rank 0 prints one line per ``log_interval`` steps, greppable as ``step=S loss=L``::

    Train Epoch: 1  Step: 20  Loss: 5.8123 | step=20 loss=5.8123 lr=2.950e-04 tok/s=8123 mfu=n/a mem=412

and appends the same numbers as one JSON object per line to ``run_dir/metrics.jsonl``, where it also
writes what the launcher must know (a checkpoint saved, the batch split) as event rows
(``fsdpctl.node.events``).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..node.events import append_line, event_line

if TYPE_CHECKING:
    from .trackers import Trackers

# Dense (no 2:4 sparsity) bf16/fp16 tensor-core peak FLOP/s per device, from vendor data sheets.
PEAK_FLOPS_BF16 = {
    "A100": 312e12,
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM
    "H200": 989e12,
    "GH200": 989e12,
}


def device_peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of this GPU when it is in the table; None on CPU or unknown GPUs."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_FLOPS_BF16, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in name:
            return PEAK_FLOPS_BF16[key]
    return None


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak allocated by torch; CPU: peak resident set size of this process."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Meter:
    """Times windows of steps (synchronising CUDA first) and remembers each window's seconds per
    step. The first step (start-up, allocator warm-up) is only counted as time to first step."""

    def __init__(self, device: torch.device, tokens_per_step: int, flops_per_token: float,
                 world: int, start_time: float):
        self.device, self.tokens_per_step, self.world = device, tokens_per_step, world
        self.flops_per_token = flops_per_token
        self.peak = device_peak_flops(device)
        self.start_time = start_time
        self.time_to_first_step: float | None = None
        self.window_start, self.window_steps = 0.0, 0
        self.step_times: list[float] = []  # seconds per step, one entry per window

    def step_done(self) -> None:
        if self.time_to_first_step is None:
            synchronize(self.device)
            self.window_start = time.perf_counter()
            self.time_to_first_step = self.window_start - self.start_time
        else:
            self.window_steps += 1

    def close_window(self) -> float | None:
        """Seconds per step over the steps since the last call (None if there were none)."""
        if not self.window_steps:
            return None
        synchronize(self.device)
        now = time.perf_counter()
        per_step = (now - self.window_start) / self.window_steps
        self.step_times.append(per_step)
        self.window_start, self.window_steps = now, 0
        return per_step

    def restart_window(self) -> None:
        """Leave time spent outside training steps (evaluation, checkpoints) out of the next window."""
        synchronize(self.device)
        self.window_start, self.window_steps = time.perf_counter(), 0

    def tokens_per_s(self, step_time: float | None) -> float | None:
        return self.tokens_per_step / step_time if step_time else None

    def mfu(self, tokens_per_s: float | None) -> float | None:
        if self.peak is None or not tokens_per_s:
            return None
        return self.flops_per_token * tokens_per_s / (self.peak * self.world)

    def median_step_time(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _step_of(line: str) -> float:
    """The step a metrics.jsonl row is about: 0 for a row without one (kept); infinity for a line cut
    short when its writer died (dropped)."""
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, TypeError, AttributeError):
        return float("inf")


class RunLog:
    """Rank 0's console lines and metrics.jsonl (and its trackers, W&B / MLflow, row by row); a
    no-op on other ranks."""

    def __init__(self, run_dir: Path, rank: int, resumed_step: int | None = None, trackers: Trackers | None = None):
        """``resumed_step``: the step this run continues from; rows a failed attempt wrote after it
        are dropped, so the file reads as one run (steps continue, none twice). None: start afresh.
        ``trackers``: where each row goes besides the file (``trackers.Trackers``, started)."""
        self.enabled = rank == 0
        self.path = run_dir / "metrics.jsonl"
        self.trackers = trackers
        if not self.enabled:
            return
        if resumed_step is None:
            self.path.write_text("", encoding="utf-8")
        elif self.path.exists():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True)
                    if _step_of(line) <= resumed_step]
            tmp = run_dir / f".metrics.jsonl.{os.getpid()}.tmp"
            tmp.write_text("".join(kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def print(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def record(self, row: dict) -> None:
        if self.enabled:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(row) + "\n")
            if self.trackers is not None:
                self.trackers.log(row)

    def event(self, name: str, **fields) -> None:
        """An event row for the launcher (``fsdpctl.node.events``), in metrics.jsonl only: the trackers
        get figures, not the launcher's events."""
        if self.enabled:
            append_line(str(self.path), event_line(name, **fields))

    def end(self, status: str) -> None:
        """End the trackers' runs (``FINISHED``, ``FAILED``, ``KILLED``) before the process leaves."""
        if self.trackers is not None:
            self.trackers.finish(status)

    def train_line(self, epoch: int, step: int, loss: float, lr: float, tok_s: float | None,
                   mfu: float | None, mem_mb: float, grad_norm: float | None, extra: dict | None = None) -> None:
        self.print(f"Train Epoch: {epoch}  Step: {step}  Loss: {loss:.4f} | step={step} "
                   f"loss={loss:.4f} lr={lr:.3e} tok/s={_fmt(tok_s, '.0f')} "
                   f"mfu={_fmt(mfu, '.4f')} mem={mem_mb:.0f}")
        self.record({"kind": "train", "step": step, "epoch": epoch, "loss": loss, "lr": lr,
                     "tokens_per_s": tok_s, "mfu": mfu, "mem_mb": mem_mb, "grad_norm": grad_norm,
                     "time": time.time(), **(extra or {})})

    def timed_eval(self, step: int, evaluate: Callable[[], tuple[float, float]]) -> tuple[float, float]:
        """Run ``evaluate`` (its loss and perplexity) and write its row, with the seconds it took."""
        began = time.perf_counter()
        loss, perplexity = evaluate()
        self.val_line(step, loss, perplexity, time.perf_counter() - began)
        return loss, perplexity

    def val_line(self, step: int, loss: float, perplexity: float, seconds: float) -> None:
        """A validation's row; ``seconds`` it took (the goodput account's time between steps)."""
        self.print(f"Validation  Step: {step}  Loss: {loss:.4f} | step={step} val_loss={loss:.4f} "
                   f"val_ppl={perplexity:.2f}")
        self.record({"kind": "val", "step": step, "val_loss": loss, "val_perplexity": perplexity,
                     "time": time.time(), "eval_s": round(seconds, 4)})

    def summary(self, run_dir: Path, summary: dict) -> None:
        if self.enabled:
            tmp = run_dir / f".summary.json.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, run_dir / "summary.json")
