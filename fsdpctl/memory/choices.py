"""Which sharding fits: the choices a run can make, in the order they cost speed, the margins kept
for what a trace cannot see, each one's verdict against a GPU's memory, and the largest batch.

Pure: the traced peaks come from ``fsdpctl.workload.estimate`` (run by ``memory.runner``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

GIB = 1 << 30
MIB = 1 << 20
SHARDINGS = ("no-shard", "grad-op", "full", "hybrid")
"""By the communication they add to a step: replicas all-reduce the gradients; grad-op gathers the
parameters once and reduce-scatters; full gathers again for backward; hybrid shards in a node only."""


@dataclass(frozen=True)
class Margins:
    """What a GPU holds beyond the tensors a step allocates, which no trace sees; each one an
    assumption, named where it is used."""

    cuda_context: int = 1 * GIB
    """The CUDA context, cuBLAS/cuDNN workspaces and loaded kernels: 0.5-1 GiB on current GPUs."""
    nccl: int = GIB // 2
    """NCCL's communicator buffers and channels when there are peers: a few hundred MiB per process."""
    allocator: float = 0.10
    """The caching allocator's rounding and fragmentation: reserved runs 5-15 % above allocated."""

    def total(self, peak: int, world: int) -> int:
        return self.cuda_context + (self.nccl if world > 1 else 0) + int(self.allocator * peak)

    def assumptions(self, world: int) -> list[str]:
        notes = [f"CUDA context, cuBLAS/cuDNN workspaces and kernels: {self.cuda_context / GIB:.1f} GiB",
                 f"the caching allocator's rounding and fragmentation: {self.allocator:.0%} of the traced peak"]
        if world > 1:
            notes.insert(1, f"NCCL's buffers: {self.nccl / GIB:.1f} GiB")
        return notes

    def to_json(self) -> dict[str, Any]:
        return {"cuda_context_bytes": self.cuda_context, "nccl_bytes": self.nccl, "allocator_fraction": self.allocator}


@dataclass(frozen=True)
class Choice:
    """One way to run the step: its settings, and the estimate traced (or derived) for it."""

    sharding: str
    activation_checkpointing: bool
    cpu_offload: bool
    result: dict[str, Any] = field(compare=False, default_factory=dict)
    derived: Optional[str] = None
    """How the figure was made when it was not traced for this choice itself."""

    @property
    def key(self) -> tuple[str, bool, bool]:
        return self.sharding, self.activation_checkpointing, self.cpu_offload

    @property
    def peak(self) -> Optional[int]:
        return self.result.get("peak_bytes")

    def speed_rank(self) -> tuple[int, int, int]:
        """Fastest first: offloading crosses PCIe at every step, recomputation repeats a third of
        the arithmetic, and each sharding level adds collectives (mostly hidden behind compute)."""
        return int(self.cpu_offload), int(self.activation_checkpointing), SHARDINGS.index(self.sharding)

    def label(self) -> str:
        extras = [name for name, on in (("checkpointing", self.activation_checkpointing),
                                        ("cpu offload", self.cpu_offload)) if on]
        return self.sharding + (" + " + " + ".join(extras) if extras else "")


def grid(multi_node: bool) -> list[Choice]:
    """The choices a table shows, fastest first."""
    shardings = [s for s in SHARDINGS if s != "hybrid" or multi_node]
    choices = [Choice(s, ac, off) for off in (False, True) for ac in (False, True) for s in shardings]
    return sorted(choices, key=Choice.speed_rank)


def with_offload(base: dict[str, Any]) -> dict[str, Any]:
    """A choice with CPU offload, from the same choice's trace without it: the sharded parameters,
    their gradients and the optimizer's states move to host memory; the rest stays."""
    moved = ("parameters (sharded)", "gradients (sharded)", "optimizer states")
    breakdown = dict(base.get("breakdown") or {})
    host = sum(breakdown.pop(name, 0) for name in moved)
    out = {**base, "breakdown": breakdown, "host_bytes": host}
    if base.get("peak_bytes") is not None:
        out["peak_bytes"] = base["peak_bytes"] - host
    return out


@dataclass(frozen=True)
class Verdict:
    """A peak against a GPU: what it needs with the margins, what is left."""

    needed: int
    capacity: int

    @property
    def fits(self) -> bool:
        return self.needed <= self.capacity

    @property
    def left(self) -> int:
        return self.capacity - self.needed


def verdict(peak: int, capacity: int, margins: Margins, world: int) -> Verdict:
    return Verdict(peak + margins.total(peak, world), capacity)


def largest_batch(batch: int, peak: int, other_batch: int, other_peak: int, capacity: int, margins: Margins,
                  world: int) -> Optional[int]:
    """The largest batch whose peak still fits, from two traces of the same choice at two batch
    sizes: a step's memory grows linearly with the batch (activations, temporaries, the logits)."""
    if other_batch == batch or other_peak <= peak:
        return None
    return _batch_on_line(batch, peak, (other_peak - peak) / (other_batch - batch), capacity, margins, world)


def _batch_on_line(batch: int, peak: int, per_sample: float, capacity: int, margins: Margins, world: int) -> int:
    """The largest batch that fits on the line through (``batch``, ``peak``) of slope ``per_sample``."""
    fixed = peak - per_sample * batch
    # peak(b) + margins(peak(b)) <= capacity, with margins linear in the peak
    fixed_margin = margins.cuda_context + (margins.nccl if world > 1 else 0)
    room = (capacity - fixed_margin) / (1 + margins.allocator) - fixed
    return max(0, math.floor(room / per_sample))


BATCH_PARTS = ("activations", "temporaries", "inputs")
"""What a step holds per sample: it grows with the batch; the rest (parameters, gradients, the
optimizer's states, the collectives' buffers) does not."""


def bytes_per_sample(result: dict[str, Any]) -> Optional[float]:
    """From one trace's breakdown at its peak: what each sample of its batch holds there (None: the
    breakdown does not say)."""
    batch, breakdown = result.get("batch_size"), result.get("breakdown") or {}
    held = sum(breakdown.get(part, 0) for part in BATCH_PARTS)
    return held / batch if batch and held > 0 else None


def search_largest_batch(batch: int, peak: int, per_sample: Optional[float], peak_at: Callable[[int], Optional[int]],
                         capacity: int, margins: Margins, world: int, tries: int = 4) -> tuple[int, int]:
    """The largest batch whose traced peak fits, and how many traces it took: the first guess from
    ``per_sample`` (one trace's own breakdown; without it, twice the batch is traced to learn the
    slope), then the line through the traced batch and the last guess, until a guess that fits is
    where the line says to stop, or a batch that fits sits just below one that does not.
    ``peak_at(b)``: the traced peak at batch b (None: not traced). ``batch`` itself fits."""
    def fits(bytes_: int) -> bool:
        return verdict(bytes_, capacity, margins, world).fits

    guess = max(1, _batch_on_line(batch, peak, per_sample, capacity, margins, world)) if per_sample else 2 * batch
    best, too_big, traced = batch, None, 0
    for _ in range(tries):
        if guess <= batch:
            break
        found = peak_at(guess)
        traced += 1
        if found is None:
            break
        if fits(found):
            best = max(best, guess)
        else:
            too_big = guess if too_big is None else min(too_big, guess)
        following = largest_batch(batch, peak, guess, found, capacity, margins, world)
        if following is None or (too_big is not None and too_big <= best + 1):
            break
        if too_big is not None:
            following = min(following, too_big - 1)
        if following <= best:
            break
        guess = following
    return best, traced


def pick(choices: Sequence[Choice], capacity: int, margins: Margins, world: int) -> Optional[Choice]:
    """The fastest choice that fits."""
    for choice in sorted(choices, key=Choice.speed_rank):
        if choice.peak is not None and verdict(choice.peak, capacity, margins, world).fits:
            return choice
    return None
