"""A rank's training steps as its hooks see them: where each step ends, and what went into it.

A step ends at the end of the outermost ``Optimizer.step`` that follows at least one backward call
(an optimizer container's inner steps, the per-parameter steps of an optimizer run inside backward,
and an optimizer step without a backward are no step of their own). What happened on the training
thread since the last step's end is the step's: its wall time, the time spent waiting for a batch
(``data_s``) and in collectives (``comm_s``), its backward calls and their scalars (the loss), the
tokens of its batches, and the operations its process groups ran that no wrapper timed
(``untimed_ops``: collectives inside compiled code, or issued by torch's C++). A step a gradient
scaler skipped (inf or NaN gradients: no optimizer step) is no step either: what it took is
dropped, and the next step begins after it.

Pure Python, no torch: the hooks call it, and the reporter's thread takes the finished steps from
``done``. Only the training thread (the first one that calls backward) counts.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

DONE_LIMIT = 100_000
"""Finished steps waiting for the reporter at most (it takes them every second)."""


@dataclass
class Step:
    """One finished step of this rank."""

    number: int
    ended: float
    """``time.time()`` at its end."""
    wall_s: float
    data_s: float
    comm_s: float
    backward: int
    loss: Any
    """The sum of its backward scalars: a float, a handle the reporter resolves later (a GPU's
    copy in flight), or None (no scalar went into backward)."""
    tokens: int
    """The tokens its batches held (0: none seen)."""
    ended_ns: int = 0
    """``time.time_ns()`` at its end (collectives' own records are stamped so)."""
    untimed_ops: Optional[int] = None
    """Operations its process groups ran that no wrapper timed (None: the groups do not say)."""


class StepTracker:
    """What the hooks report, into steps. ``reduce_losses`` turns a step's loss tensors into its
    ``Step.loss`` (on a CPU a float; on a GPU a handle: no wait for the device)."""

    def __init__(self, reduce_losses: Callable[[list[Any]], Any], clock: Callable[[], float] = time.perf_counter,
                 operations: Callable[[], Optional[int]] = lambda: None):
        """``operations``: the operations every process group has run so far (None: not known)."""
        self.reduce_losses = reduce_losses
        self.clock = clock
        self.operations = operations
        self._operations_at: Optional[int] = None
        self.thread: Optional[int] = None
        self.number = 0
        self.skipped = 0
        self.done: deque[Step] = deque(maxlen=DONE_LIMIT)
        self.after_step: Optional[Callable[[Step], None]] = None
        """Told of each step as it ends, on the training thread (the GPU's mark)."""
        self._optimizers: list[int] = []
        self._begun: Optional[float] = None
        self.last_ended: Optional[float] = None
        """``time.time()`` at the newest step's end (None: no step yet)."""
        self._clear()

    def _clear(self) -> None:
        self.data_s = self.comm_s = 0.0
        self.backward = self.tokens = self.timed_ops = 0
        self.losses: list[Any] = []

    def _restart(self, now: float) -> None:
        """The next step begins now."""
        self._begun = now
        self._operations_at = self.operations()
        self._clear()

    def training_thread(self) -> bool:
        """Whether the calling thread is the training thread (before the first backward: any thread)."""
        return self.thread is None or threading.get_ident() == self.thread

    def begin(self) -> None:
        """Something of a step happened (a batch asked for, a backward): the first step begins."""
        if self._begun is None:
            self._begun = self.clock()
            self._operations_at = self.operations()

    def data(self, seconds: float, tokens: int) -> None:
        if self.training_thread():
            self.begin()
            self.data_s += seconds
            self.tokens += tokens

    def comm(self, seconds: float, operations: int = 0) -> None:
        """A collective took ``seconds`` and issued ``operations`` on the process groups."""
        if self._begun is not None and self.training_thread():  # set-up's collectives are no step's
            self.comm_s += seconds
            self.timed_ops += operations

    def backward_called(self, loss: Any) -> None:
        """A backward call began (``loss``: its scalar, None for anything else)."""
        if self.thread is None:
            self.thread = threading.get_ident()
        elif threading.get_ident() != self.thread:
            return
        self.begin()
        self.backward += 1
        if loss is not None:
            self.losses.append(loss)

    def optimizer_starts(self, optimizer: object) -> None:
        key = id(optimizer)
        if key in self._optimizers:  # its last step raised before its end: that entry is stale
            del self._optimizers[self._optimizers.index(key):]
        self._optimizers.append(key)

    def optimizer_ended(self, optimizer: object) -> Optional[Step]:
        """The step that ended with this optimizer's step, if one did."""
        key = id(optimizer)
        if key in self._optimizers:
            del self._optimizers[self._optimizers.index(key):]
        if self._optimizers or not self.backward or not self.training_thread():
            return None
        now, operations = self.clock(), self.operations()
        untimed = None
        if operations is not None and self._operations_at is not None:
            untimed = max(0, operations - self._operations_at - self.timed_ops)
        self.number += 1
        step = Step(number=self.number, ended=time.time(), ended_ns=time.time_ns(),
                    wall_s=now - (self._begun if self._begun is not None else now), data_s=self.data_s,
                    comm_s=self.comm_s, backward=self.backward,
                    loss=self.reduce_losses(self.losses) if self.losses else None, tokens=self.tokens,
                    untimed_ops=untimed)
        self.done.append(step)
        self.last_ended = step.ended
        self._begun, self._operations_at = now, operations
        self._clear()
        if self.after_step is not None:
            self.after_step(step)
        return step

    def scaler_stepped(self, number_before: int) -> None:
        """A gradient scaler's ``step`` returned: when it made no optimizer step (inf or NaN found),
        the iteration is dropped and the next step begins now."""
        if self.number == number_before and self.backward and self.training_thread():
            self.skipped += 1
            self._restart(self.clock())
