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
from .config import REQUEUE_MARKER, STOP_MARKER

_WATCHED = (signal.SIGUSR2, signal.SIGTERM)
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1")
"""What a profile's ``stop_signal`` may name (``FSDPCTL_STOP_SIGNAL``)."""


def stop_marker(run_dir: Path) -> Path:
    """Where fsdpctl marks a stop it asked for (``STOP_MARKER``), seen from a rank."""
    return Path(os.environ.get("FSDPCTL_RUN_DIR") or run_dir) / STOP_MARKER


def stop_signals_for(cfg) -> StopSignals | None:
    """The handlers a run takes: with ``checkpoint_on_signal``, SIGUSR2 and SIGTERM (Slurm's warning
    and its end), whoever sends them. Launched by fsdpctl with checkpoints on, SIGTERM and the
    profile's stop signal (``FSDPCTL_STOP_SIGNAL``), acted on when fsdpctl asked for the stop (its
    ``STOP_MARKER`` in the run directory); unasked, as that signal's default would, at once (a hang
    or a failed peer ends the ranks without a save). None: no handler, the signals' defaults."""
    if cfg.checkpoint_on_signal:
        return StopSignals(_WATCHED)
    named = os.environ.get("FSDPCTL_STOP_SIGNAL", "")
    if not named or cfg.no_checkpoint:
        return None
    extra = (getattr(signal, named),) if named in STOP_SIGNALS and named != "SIGTERM" else ()
    return StopSignals((signal.SIGTERM, *extra), asked=stop_marker(Path(cfg.run_dir).expanduser()))


class StopSignals:
    """Installs handlers for ``watched`` that only take note (nothing unsafe in a handler). With
    ``asked`` (a path), a signal that comes while it does not exist ends the rank at once, as the
    signal's default action would."""

    def __init__(self, watched: tuple[signal.Signals, ...], asked: Path | None = None) -> None:
        self.watched = watched
        self.asked = asked
        self.seen: dict[int, bool] = {sig: False for sig in self.watched}
        self.group = None
        for sig in self.watched:
            signal.signal(sig, self._note)

    def _note(self, signum: int, frame) -> None:
        if self.asked is not None and not self.asked.exists():
            os._exit(128 + signum)  # not fsdpctl's orderly stop: end as the default action would
        self.seen[signum] = True

    def use_cpu_group(self, device: torch.device) -> None:
        """Agree over a gloo group of host tensors when training on a GPU (a collective: every rank
        calls it): the per-step check then never waits for the GPU to finish its queued work."""
        if device.type != "cpu":
            self.group = dist.new_group(backend="gloo")

    def agreed(self) -> list[signal.Signals]:
        """The signals any rank has seen (a collective: every rank must call it at the same point)."""
        flags = torch.tensor([int(self.seen[sig]) for sig in self.watched], dtype=torch.int32)
        dist.all_reduce(flags, group=self.group)
        return [sig for sig, count in zip(self.watched, flags.tolist(), strict=True) if count]


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

    After SIGUSR2 (the time limit is near) exit 0 with the requeue marker. After another signal exit
    0 when fsdpctl asked for the stop (``STOP_MARKER``: ``fsdpctl stop``, a launcher's Ctrl-C or
    SIGTERM), else 128 + its number, as a terminated process would: whoever sent it is ending the
    job anyway. A SIGUSR2 before this run trained a single step asks for no requeue (exit 1):
    another attempt would stop at the same point again, forever."""
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
    if requeue or signal.SIGUSR2 in received:
        code = 0 if requeue else 1
    else:
        code = 0 if stop_marker(run_dir).exists() else 128 + received[0]
    os._exit(code)  # no interpreter shutdown after gloo (see train.run)
