"""What the telemetry asks of the device without ever waiting for it.

- A step's loss: on a CPU the sum of its backward scalars as a float (free); on a GPU the sum is
  copied, asynchronously, into a slot of pinned host memory with an event behind it, and read by the
  reporter once the event has passed: no ``.item()``, no synchronisation of the training thread.
- The GPU's own step time: one event per step on the current stream; the time between two events,
  read once both have passed.
- NCCL's collective times, where timing is on (``TORCH_NCCL_ENABLE_TIMING=1``): the flight
  recorder's entries (``duration_ms``, stamped ``time_created_ns``), read off the training thread and
  given to the steps they were created in.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Iterable
from typing import Any, Optional

SLOTS = 256
"""Losses in flight at most (one per step; the reporter frees them every second)."""


def cpu_loss(losses: list[Any]) -> float:
    return float(sum(float(loss) for loss in losses))


class PendingLoss:
    """A GPU step's loss on its way to the host."""

    __slots__ = ("event", "slot", "reader")

    def __init__(self, event: Any, slot: int, reader: GpuLosses):
        self.event, self.slot, self.reader = event, slot, reader

    def value(self) -> tuple[bool, Optional[float]]:
        """(ready, the loss): not ready while the device has not copied it yet."""
        if not self.event.query():
            return False, None
        value = float(self.reader.host[self.slot])
        self.reader.free.append(self.slot)
        return True, value

    def abandon(self) -> None:
        """Its step went out without it: the slot is freed once the device is done with it (not
        before: the copy would land in another step's slot)."""
        self.reader.abandoned.append(self)


class GpuLosses:
    """Pinned slots for GPU losses; ``reduce`` is the StepTracker's ``reduce_losses``."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.host = torch.zeros(SLOTS, dtype=torch.float32, pin_memory=True)
        self.free: deque[int] = deque(range(SLOTS))
        self.abandoned: list[PendingLoss] = []

    def reclaim(self) -> None:
        """The slots of abandoned losses whose copy has passed, free again."""
        if self.abandoned:
            passed = [loss for loss in self.abandoned if loss.event.query()]
            self.abandoned = [loss for loss in self.abandoned if loss not in passed]
            self.free.extend(loss.slot for loss in passed)

    def reduce(self, losses: list[Any]) -> Any:
        torch = self.torch
        if not losses[0].is_cuda:
            return cpu_loss(losses)
        if not self.free:
            self.reclaim()
        if not self.free or torch.cuda.is_current_stream_capturing():
            return None  # the reporter is far behind, or a CUDA graph is being captured: not read
        slot = self.free.popleft()
        total = losses[0].float() if len(losses) == 1 else torch.stack([t.float().reshape(()) for t in losses]).sum()
        self.host[slot].copy_(total.reshape(()), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingLoss(event, slot, self)


def resolve(loss: Any) -> tuple[bool, Optional[float]]:
    """(ready, value) of a ``Step.loss``."""
    if loss is None or isinstance(loss, float):
        return True, loss
    return loss.value()


class GpuStepTimes:
    """One event per step; the seconds between consecutive ones."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.pending: deque[tuple[int, Any]] = deque(maxlen=SLOTS)
        self.last: Optional[Any] = None
        self.seconds: dict[int, float] = {}

    def mark(self, step: int) -> None:
        if self.torch.cuda.is_current_stream_capturing():
            return  # a CUDA graph is being captured: no event of fsdpctl's in it
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        self.pending.append((step, event))

    def read(self) -> None:
        """Whatever has passed, into ``seconds`` (the reporter's thread)."""
        while self.pending and self.pending[0][1].query():
            step, event = self.pending.popleft()
            if self.last is not None:
                self.seconds[step] = self.last.elapsed_time(event) / 1000.0
            self.last = event

    def take(self, step: int) -> Optional[float]:
        return self.seconds.pop(step, None)


def nccl_entries(dump: bytes) -> list[dict[str, Any]]:
    """The flight recorder's collective entries out of ``_dump_nccl_trace``'s pickle (plain data)."""
    data = pickle.loads(dump)  # noqa: S301 - torch's own dump of this very process
    entries = data.get("entries", []) if isinstance(data, dict) else []
    return [e for e in entries if isinstance(e, dict)]


class NcclTimes:
    """NCCL's timed collectives of this process, given to the steps they were created in.

    The flight recorder's ring holds the newest entries of every process group, each numbered in its
    group (``collective_seq_id`` for collectives, ``p2p_seq_id`` for point-to-point operations: one of
    the two grows with each entry, and a group's work completes in order). An entry is new once either
    number passes the highest taken of its group: what is kept does not grow with the run."""

    def __init__(self) -> None:
        self.taken: dict[Any, tuple[int, int]] = {}  # process group -> highest (collective, p2p) taken
        self.pending: list[tuple[int, float]] = []  # (created ns, seconds), not yet given to a step

    def add(self, entries: Iterable[dict[str, Any]]) -> None:
        fresh = []
        for entry in entries:
            duration = entry.get("duration_ms")
            if duration is None or entry.get("state") != "completed":
                continue
            group = entry.get("pg_id")
            numbers = (int(entry.get("collective_seq_id") or 0), int(entry.get("p2p_seq_id") or 0))
            collective, p2p = self.taken.get(group, (-1, -1))
            if numbers[0] <= collective and numbers[1] <= p2p:
                continue  # taken from an earlier dump
            fresh.append((group, numbers))
            self.pending.append((int(entry.get("time_created_ns") or 0), float(duration) / 1000.0))
        for group, (collective, p2p) in fresh:
            had = self.taken.get(group, (-1, -1))
            self.taken[group] = (max(had[0], collective), max(had[1], p2p))

    def for_step(self, ended_ns: int) -> float:
        """The seconds of the collectives created before ``ended_ns`` (a step's end, steps in order)."""
        mine = [s for created, s in self.pending if created <= ended_ns]
        self.pending = [(created, s) for created, s in self.pending if created > ended_ns]
        return sum(mine)
