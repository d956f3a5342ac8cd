"""Every rank's steps, loss and times from a user's unchanged program: what fsdpctl's start-up hook
installs in each rank once the program imports torch.

What it captures, and from where (``patches``): the step's end (the global optimizer step hooks),
the loss (the scalars passed to backward since the last step, unscaled through ``GradScaler.scale``),
the wait for batches (torch's DataLoader iterator), the time in collectives (the outermost
``torch.distributed`` call or ``Work.wait`` of the training thread: real waiting with gloo; with NCCL
the kernels' own times from its flight recorder, only where ``TORCH_NCCL_ENABLE_TIMING=1``), compute
(the rest of the step), the peak memory (allocated on a GPU, the high-water RSS on a CPU) and the
tokens a batch shows (an integer 2-D tensor, or ``input_ids``: estimated) or that the launch
declares (``FSDPCTL_TOKENS_PER_STEP``, over all ranks); MFU where the launch gives the FLOPs of a
token (``FSDPCTL_FLOPS_PER_TOKEN``) and fsdpctl knows the GPU's peak. A reporter thread writes one row per window
of steps (about a second) to ``$FSDPCTL_RUN_DIR/telemetry/node<N>.jsonl``, which the launcher
brings back with the run's other side files.

What it cannot see: loops that use ``torch.autograd.grad`` only (no backward call), pipeline stages
(no scalar reaches backward), optimizers that do not derive from ``torch.optim.Optimizer`` (no step
hook), DDP's gradient all-reduce (it runs in C++: compute is then not told apart from waiting), and
NCCL's waits without its timing.

It fails open: an error of its own turns it off for that rank with one line in the log; the
program, its numbers and its exit code are never changed. ``FSDPCTL_TELEMETRY=0`` turns it off.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from typing import Any, Optional

from .device import GpuLosses, cpu_loss
from .patches import Patches, say_to_stderr
from .reporter import Reporter
from .steps import StepTracker

TELEMETRY_DIR = "telemetry"
INSTALLED: list[Reporter] = []
"""This process's reporter, once installed (its ``patches.off`` pauses every wrapper: bench/ uses it)."""


def rows_path(run_dir: str, node_rank: str) -> str:
    """A node's telemetry file (every local rank appends its rows to it)."""
    return os.path.join(run_dir, TELEMETRY_DIR, f"node{node_rank}.jsonl")


def _reducer(torch: Any) -> Callable[[list[Any]], Any]:
    """The StepTracker's loss reduction: a float on a CPU; on a GPU, pinned slots made at the first
    CUDA loss (after the program chose its device), never a wait."""
    gpu: list[GpuLosses] = []

    def reduce(losses: list[Any]) -> Any:
        if not getattr(losses[0], "is_cuda", False):
            return cpu_loss(losses)
        if not gpu:
            gpu.append(GpuLosses(torch))
        return gpu[0].reduce(losses)
    return reduce


def _number(name: str) -> Optional[float]:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _say_exit(tracker: StepTracker, patches: Patches, path: str) -> None:
    """The program leaves: its last step's end, for the goodput account (the time it ran after it);
    nothing once the telemetry is off."""
    if patches.off:
        return
    try:
        from ..events import PROGRAM_EXIT, append_line, event_line

        last = tracker.last_ended
        append_line(path, event_line(PROGRAM_EXIT, last_step_at=None if last is None else round(last, 3),
                                     steps=tracker.number))
    except Exception:  # noqa: BLE001, S110 - the program is leaving: nothing of ours may change its exit
        pass


def install(run_dir: str, rank: str, when_imported: Callable[[str, Callable[[Any], None]], None]) -> Optional[Reporter]:
    """Put the wrappers on this process's torch and start the reporter; None (and torch as it was)
    where that fails. ``when_imported(name, callback)`` calls back once module ``name`` is imported."""
    import torch

    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
    tracker = StepTracker(_reducer(torch))
    patches = Patches(tracker, say_to_stderr, compiling=compiling)
    tracker.operations = patches.group_operations
    try:
        patches.install()
        place = {"rank": int(rank), "node": int(os.environ.get("FSDPCTL_NODE_RANK") or os.environ.get("GROUP_RANK")
                                                 or 0),
                 "host": os.environ.get("FSDPCTL_HOST") or os.uname().nodename,
                 "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0)}
        reporter = Reporter(tracker, patches, rows_path(run_dir, str(place["node"])), place, torch=torch,
                            tokens_per_step=_number("FSDPCTL_TOKENS_PER_STEP"),
                            flops_per_token=_number("FSDPCTL_FLOPS_PER_TOKEN"),
                            nccl_timing=os.environ.get("TORCH_NCCL_ENABLE_TIMING", "0") not in ("", "0"),
                            world=int(os.environ.get("WORLD_SIZE", "1") or 1))
        tracker.after_step = reporter.step_ended
        reporter.start()
        atexit.register(reporter.close)
        if place["rank"] == 0:  # after the program's own exit handlers: registered before theirs
            atexit.register(_say_exit, tracker, patches, rows_path(run_dir, str(place["node"])))
        os.register_at_fork(after_in_child=lambda: setattr(patches, "off", True))
        # dynamo's table of traceable collectives is built from c10d's names when first imported
        when_imported("torch.distributed._functional_collectives", patches.keep_remaps_original)
        when_imported("torch._dynamo", patches.skip_own_frames)
        INSTALLED.append(reporter)
        return reporter
    except Exception as exc:  # noqa: BLE001 - torch as the program expects it, whatever happened here
        patches.fail(exc)
        return None
