"""Per-rank timings of the training step: time computing, waiting in or for collectives, loading data.

Compute is measured where it happens, not inferred: each transformer block's arithmetic (forward,
and its backward between two autograd marks), the head with the loss, and the optimizer step are
bracketed by marks. On a GPU the marks are CUDA events on the compute stream (read once per logged
window, after the synchronisation the window's end makes anyway: no stall per step); on a CPU,
the host's clock. FSDP's communication and the waits for it sit outside the brackets (its hooks
run around the block, before and after its compute), so what a step spends in or waiting for
collectives is the rest: wall time minus compute minus data. A rank that computes slowly makes
the others wait at the next collective: its compute stands out and its waiting does not.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import torch
import torch.distributed as dist

from .metrics import synchronize
from .straggler import Tally


class _Clock:
    """Marks on the host's clock (CPU) or CUDA events on the current stream (GPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spare: list[Any] = []

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = self.spare.pop() if self.spare else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, end: Any) -> float:
        """After the device has reached ``end`` (the window's synchronisation)."""
        if not self.cuda:
            return end - start
        elapsed = start.elapsed_time(end) / 1000.0
        self.spare += (start, end)
        return elapsed


class _Mark(torch.autograd.Function):
    """Identity in forward; in backward, notes when the gradient passes (``at`` is called)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, at) -> torch.Tensor:  # noqa: ANN001
        ctx.at = at
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001
        ctx.at()
        return grad, None


class RankTimer:
    """Collects this rank's compute and data seconds over a window of steps; ``window()`` gives them
    with the wall time and resets. Disabled (``enabled=False``), every method is a no-op."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.enabled = enabled
        self.clock = _Clock(device)
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        self.pairs: list[tuple[Any, Any]] = []  # compute brackets not yet read
        self.open_backward: list[Any] = []
        self.data_s = 0.0
        self.steps = 0
        self.started = now

    def step(self) -> None:
        """A training step ended (counted into the window)."""
        self.steps += 1

    def compute(self, fn, *args):
        """``fn(*args)`` as compute time (a block's forward arithmetic, the head and loss, the optimizer)."""
        if not self.enabled:
            return fn(*args)
        start = self.clock.mark()
        out = fn(*args)
        self.pairs.append((start, self.clock.mark()))
        return out

    def block(self, fn, x: torch.Tensor) -> torch.Tensor:
        """A block's forward as compute, and its backward too: a hook on its output's gradient node
        and a mark on its input note when backward reaches the block and when it leaves it."""
        if not self.enabled or not torch.is_grad_enabled():
            return fn(x)
        x = _Mark.apply(x, self._backward_done)
        out = self.compute(fn, x)
        # Backward reaches the block when its output's gradient node runs: a pre-hook there marks it,
        # after FSDP's own hook on that output has gathered the parameters (tensor hooks run before
        # node pre-hooks). A _Mark on the output would hand FSDP2 a view (an autograd Function
        # returns its input as a view of it), which FSDP2 warns about on every rank, every step.
        if out.grad_fn is not None:
            out.grad_fn.register_prehook(self._backward_starts)
        return out

    def _backward_starts(self, grad_outputs: tuple) -> None:
        """A pre-hook of a block output's gradient node; returning None passes the gradients on unchanged."""
        self.open_backward.append(self.clock.mark())

    def _backward_done(self) -> None:
        if self.open_backward:
            self.pairs.append((self.open_backward.pop(), self.clock.mark()))

    def data(self, seconds: float) -> None:
        self.data_s += seconds

    def window(self) -> dict[str, float]:
        """compute_s, data_s, comm_s and wall_s since the last call; the device must have reached
        every mark (the caller synchronises first)."""
        now = time.perf_counter()
        wall = now - self.started
        compute = sum(self.clock.seconds(a, b) for a, b in self.pairs)
        out = {"wall_s": wall, "compute_s": compute, "data_s": self.data_s,
               "comm_s": max(0.0, wall - compute - self.data_s)}
        self._reset(now)
        return out

    def restart(self) -> None:
        """Leave what happened since the last window (the first step, evaluation, a checkpoint) out of
        the next one; the device has reached every mark (the caller synchronised)."""
        if self.clock.cuda:
            self.clock.spare += [event for pair in self.pairs for event in pair]
        self._reset(time.perf_counter())


class RankWindows:
    """At each logged step: every rank's timings for the window, gathered to rank 0 with the loss
    (one all-gather of a few numbers per rank, in place of the loss's all-reduce), and the
    straggler rule applied as the run goes."""

    def __init__(self, rt, timer: RankTimer):
        self.rt, self.timer, self.tally = rt, timer, Tally()
        me = {"host": os.environ.get("FSDPCTL_HOST") or socket.gethostname(),
              "node": int(os.environ.get("GROUP_RANK", rt.rank // max(1, rt.local_world))),
              "local_rank": int(os.environ.get("LOCAL_RANK", rt.rank % max(1, rt.local_world)))}
        self.places: list[dict] = [{} for _ in range(rt.world)]
        dist.all_gather_object(self.places, me)

    def gather(self, step_loss: torch.Tensor, mem_mb: float) -> tuple[float, list[dict] | None]:
        """(the mean loss over ranks, per-rank timings per step of this window or None when it
        measured no step). Synchronises the device (the window's end)."""
        synchronize(self.rt.device)
        steps = self.timer.steps
        times = self.timer.window()
        per = max(steps, 1)
        mine = torch.tensor([float(step_loss), times["compute_s"] / per, times["comm_s"] / per,
                             times["data_s"] / per, times["wall_s"] / per, mem_mb, float(steps)],
                            dtype=torch.float64)
        rows = [torch.zeros_like(mine) for _ in range(self.rt.world)]
        dist.all_gather(rows, mine)
        loss = sum(float(r[0]) for r in rows) / self.rt.world
        if not self.timer.enabled or min(int(r[6]) for r in rows) == 0:
            return loss, None
        ranks = [{"rank": i, **self.places[i], "compute_s": round(float(r[1]), 6), "comm_s": round(float(r[2]), 6),
                  "data_s": round(float(r[3]), 6), "wall_s": round(float(r[4]), 6), "mem_mb": round(float(r[5]), 1)}
                 for i, r in enumerate(rows)]
        if self.rt.rank == 0:
            self.tally.add(ranks)
        return loss, ranks
