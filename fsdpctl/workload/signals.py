"""Stop cleanly on a scheduler's signal: remember it, agree across ranks at a step boundary.

A signal reaches the ranks at slightly different moments (or only some of them, when a user sends
it by hand), so no rank acts on it alone: at every step boundary the ranks sum what each has
seen, and all of them stop after the same step. SIGUSR2 is Slurm's warning ahead of the time
limit (``--signal=USR2@<s>``; SIGUSR1 is NCCL's); SIGTERM is what Slurm and torchrun send when a
job is preempted, requeued or cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint as ckpt
from .config import REQUEUE_MARKER

_WATCHED = (signal.SIGUSR2, signal.SIGTERM)


class StopSignals:
    """Installs handlers for SIGUSR2 and SIGTERM that only take note (nothing unsafe in a handler)."""

    def __init__(self) -> None:
        self.seen: dict[int, bool] = {sig: False for sig in _WATCHED}
        self.group = None
        for sig in _WATCHED:
            signal.signal(sig, self._note)

    def _note(self, signum: int, frame) -> None:
        self.seen[signum] = True

    def use_cpu_group(self, device: torch.device) -> None:
        """Agree over a gloo group of host tensors when training on a GPU (a collective: every rank
        calls it): the per-step check then never waits for the GPU to finish its queued work."""
        if device.type != "cpu":
            self.group = dist.new_group(backend="gloo")

    def agreed(self) -> list[signal.Signals]:
        """The signals any rank has seen (a collective: every rank must call it at the same point)."""
        flags = torch.tensor([int(self.seen[sig]) for sig in _WATCHED], dtype=torch.int32)
        dist.all_reduce(flags, group=self.group)
        return [sig for sig, count in zip(_WATCHED, flags.tolist(), strict=True) if count]


def write_requeue_marker(run_dir: Path, step: int, checkpoint: str | None) -> None:
    """Rank 0, after the checkpoint is complete: tell the job's script to requeue it."""
    tmp = run_dir / f".{REQUEUE_MARKER}.tmp"
    tmp.write_text(json.dumps({"step": step, "checkpoint": checkpoint}) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / REQUEUE_MARKER)


def clear_requeue_marker(run_dir: Path) -> None:
    """A (re)started run has taken up the marker's checkpoint; a stale marker must not requeue it again."""
    (run_dir / REQUEUE_MARKER).unlink(missing_ok=True)


def stop_on_signal(received: list[signal.Signals], step: int, steps_this_run: int, last_saved: int, save,
                   run_dir: Path, rt, log) -> None:
    """Every rank agreed a stop signal came: save this step (unless just saved) and leave.

    After SIGUSR2 (the time limit is near) exit 0 with the requeue marker; after SIGTERM alone
    exit 143, as a terminated process would: whoever sent it is ending the job anyway. A SIGUSR2
    before this run trained a single step asks for no requeue (exit 1): another attempt would
    stop at the same point again, forever."""
    if step != last_saved:
        save(step)
    checkpoint = ckpt.latest_checkpoint(run_dir)
    names = "+".join(sig.name for sig in received)
    requeue = signal.SIGUSR2 in received and steps_this_run > 0
    if requeue and rt.rank == 0:
        write_requeue_marker(run_dir, step, checkpoint.name if checkpoint else None)
    note = ("; requeue requested" if requeue else "; no step ran in this attempt, so no requeue: leave more "
            "time between the warning and the time limit" if signal.SIGUSR2 in received else "")
    log.print(f"fsdpctl.workload: {names} received: stopped after step {step}, checkpoint "
              f"{checkpoint.name if checkpoint else 'none'}{note}")
    log.end("KILLED")  # this attempt's tracker runs; a requeued or resumed attempt makes its own
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    code = 0 if requeue else 1 if signal.SIGUSR2 in received else 128 + signal.SIGTERM
    os._exit(code)  # no interpreter shutdown after gloo (see train.run)
