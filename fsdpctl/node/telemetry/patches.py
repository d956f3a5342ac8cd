"""The wrappers fsdpctl puts on torch in a rank of a user's program, feeding a ``StepTracker``.

- the global optimizer step hooks (``torch.optim.optimizer``): where a step ends;
- ``Tensor.backward`` and ``torch.autograd.backward``: backward calls and their scalars (the loss),
  through ``GradScaler.scale``'s output back to its unscaled input; ``GradScaler.step``: a step the
  scaler skipped;
- ``_BaseDataLoaderIter.__next__`` (torch's DataLoader, and the loaders built on it): the wait for a
  batch, and its tokens where the batch shows them;
- the collectives of ``torch.distributed`` and ``Work.wait``, the outermost call of each thread: the
  time spent in them (real waiting with gloo; with NCCL only the launch, so it is not used there);
- ``DistributedDataParallel.__init__``: DDP's gradient all-reduce runs in C++, out of sight;
- ``torch.cuda.reset_peak_memory_stats``: a program that resets the peak (fsdpctl never does).

Every wrapper calls the original whatever happens; an error of fsdpctl's own turns all of them off
(``Patches.fail``) and the program goes on as if they had never been there. Once ``torch._dynamo``
is imported, each wrapper is swapped for one dynamo does not trace (``compile_safe``), so a
compiled program gets no graph break from them.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Optional

from .steps import StepTracker

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_single", "all_gather_into_tensor",
               "all_gather_coalesced", "all_gather_object", "reduce_scatter", "reduce_scatter_single",
               "reduce_scatter_tensor", "_reduce_scatter_base", "_all_gather_base", "broadcast",
               "broadcast_object_list", "barrier", "monitored_barrier", "all_to_all", "all_to_all_single", "reduce",
               "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv", "batch_isend_irecv")
SCALED_KEPT = 64
"""Scaled losses remembered (with their unscaled values) until the step that used them ends."""


def batch_tokens(batch: Any) -> int:
    """The tokens a batch holds where it shows them: an integer 2-D tensor (the first such in a
    tuple or list), or ``input_ids`` in a mapping; else 0."""
    candidate = batch
    if callable(getattr(batch, "get", None)):  # a dict, HF's BatchEncoding
        try:
            candidate = batch.get("input_ids")
        except Exception:  # noqa: BLE001 - a mapping of the user's that refuses: no tokens seen
            return 0
    elif isinstance(batch, (tuple, list)) and batch:
        candidate = batch[0]
    shape = getattr(candidate, "shape", None)
    dtype = getattr(candidate, "dtype", None)
    if shape is None or len(shape) != 2 or dtype is None or getattr(dtype, "is_floating_point", True) \
            or getattr(dtype, "is_complex", False) or str(dtype) == "torch.bool":
        return 0
    return int(shape[0]) * int(shape[1])


class Patches:
    """Installs the wrappers (``install``), turns them off (``undo``)."""

    def __init__(self, tracker: StepTracker, say: Callable[[str], None]):
        self.tracker = tracker
        self.say = say
        self.off = False
        self.ddp = False
        self.peak_reset = False
        self.local = threading.local()
        self.scaled: list[tuple[Any, Any]] = []
        self._set: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)
        self._handles: list[Any] = []
        self._disable: Optional[Callable[[Any], Any]] = None
        self._tensor: Any = None

    # ---- on and off ------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """An error of fsdpctl's own: every wrapper off, one line in the rank's log."""
        if self.off:
            return
        self.off = True
        self.undo()
        self.say(f"fsdpctl: rank telemetry is off for this rank ({type(exc).__name__}: {exc}); "
                 "the program goes on unchanged")

    def undo(self) -> None:
        for owner, name, original, _ in reversed(self._set):
            setattr(owner, name, original)
        self._set.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        wrapper = make(original)
        setattr(owner, name, self._disable(wrapper) if self._disable else wrapper)
        self._set.append((owner, name, original, wrapper))

    def compile_safe(self, dynamo: Any) -> None:
        """``torch._dynamo`` was imported: every wrapper again, as a function dynamo leaves alone."""
        if self.off:
            return
        try:
            self._disable = dynamo.disable
            for owner, name, _original, wrapper in self._set:
                setattr(owner, name, dynamo.disable(wrapper))
            self._register_optimizer_hooks()
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    # ---- install ---------------------------------------------------------------------------------
    def install(self) -> None:
        """Every wrapper, on the torch this process imported (raises where torch lacks one of them:
        the caller then undoes what was done)."""
        self._register_optimizer_hooks()
        import torch

        self._tensor = torch.Tensor
        self._wrap(torch.Tensor, "backward", self._backward_wrapper)
        self._wrap(torch.autograd, "backward", self._backward_wrapper)
        from torch.utils.data import dataloader

        self._wrap(dataloader._BaseDataLoaderIter, "__next__", self._data_wrapper)
        import torch.distributed as dist

        if dist.is_available():
            from torch.distributed import distributed_c10d as c10d

            for name in COLLECTIVES:
                original = getattr(c10d, name, None)
                if original is None:
                    continue
                self._wrap(c10d, name, self._comm_wrapper)
                if getattr(dist, name, None) is original:
                    self._set_same(dist, name, original)
            self._wrap(torch._C._distributed_c10d.Work, "wait", self._comm_wrapper)
            from torch.nn.parallel import distributed as ddp

            self._wrap(ddp.DistributedDataParallel, "__init__", self._ddp_wrapper)
        from torch.amp import grad_scaler

        self._wrap(grad_scaler.GradScaler, "scale", self._scale_wrapper)
        self._wrap(grad_scaler.GradScaler, "step", self._scaler_step_wrapper)
        if hasattr(torch, "cuda"):
            for owner in (torch.cuda, torch.cuda.memory):
                self._wrap(owner, "reset_peak_memory_stats", self._peak_reset_wrapper)

    def _set_same(self, owner: Any, name: str, original: Any) -> None:
        """``owner.name`` is the function just wrapped elsewhere: the same wrapper there too."""
        wrapper = self._set[-1][3]
        setattr(owner, name, self._disable(wrapper) if self._disable else wrapper)
        self._set.append((owner, name, original, wrapper))

    def _register_optimizer_hooks(self) -> None:
        from torch.optim import optimizer

        for handle in self._handles:
            handle.remove()
        pre, post = self._optimizer_pre, self._optimizer_post
        if self._disable is not None:
            pre, post = self._disable(pre), self._disable(post)
        self._handles = [optimizer.register_optimizer_step_pre_hook(pre),
                         optimizer.register_optimizer_step_post_hook(post)]

    # ---- the hooks -------------------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.off:
            try:
                self.tracker.optimizer_starts(optimizer)
            except Exception as exc:  # noqa: BLE001 - torch would raise it into the program's step
                self.fail(exc)
        return None

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.off:
            try:
                if self.tracker.optimizer_ended(optimizer) is not None:
                    self.scaled.clear()
            except Exception as exc:  # noqa: BLE001
                self.fail(exc)

    def _backward_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            local = patches.local
            if patches.off or getattr(local, "in_backward", False):
                return original(tensors, *args, **kwargs)
            local.in_backward = True
            try:
                try:
                    patches.tracker.backward_called(patches._loss_of(tensors))
                except Exception as exc:  # noqa: BLE001
                    patches.fail(exc)
                return original(tensors, *args, **kwargs)
            finally:
                local.in_backward = False
        return backward

    def _loss_of(self, tensors: Any) -> Any:
        """The scalar a backward call starts from (unscaled), detached; None for anything else (a
        tensor subclass too: reading a DTensor's value could take a collective)."""
        if isinstance(tensors, (tuple, list)):
            if len(tensors) != 1:
                return None
            tensors = tensors[0]
        if type(tensors) is not self._tensor or tensors.numel() != 1:
            return None
        for scaled, unscaled in self.scaled:
            if scaled is tensors:
                return unscaled
        return tensors.detach()

    def _data_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def next_batch(iterator: Any) -> Any:
            if patches.off or not patches.tracker.training_thread():
                return original(iterator)
            began = time.perf_counter()
            batch = original(iterator)
            try:
                patches.tracker.data(time.perf_counter() - began, batch_tokens(batch))
            except Exception as exc:  # noqa: BLE001
                patches.fail(exc)
            return batch
        return next_batch

    def _comm_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            local = patches.local
            if patches.off or getattr(local, "in_comm", False):
                return original(*args, **kwargs)
            local.in_comm = True
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                local.in_comm = False
                patches.tracker.comm(time.perf_counter() - began)
        return timed

    def _scale_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def scale(scaler: Any, outputs: Any, *args: Any, **kwargs: Any) -> Any:
            scaled = original(scaler, outputs, *args, **kwargs)
            if not patches.off and getattr(outputs, "numel", None) is not None:
                try:
                    if outputs.numel() == 1:
                        patches.scaled = [*patches.scaled[-(SCALED_KEPT - 1):], (scaled, outputs.detach())]
                except Exception as exc:  # noqa: BLE001
                    patches.fail(exc)
            return scaled
        return scale

    def _scaler_step_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def step(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            before = patches.tracker.number
            result = original(scaler, *args, **kwargs)
            if not patches.off:
                try:
                    patches.tracker.scaler_stepped(before)
                except Exception as exc:  # noqa: BLE001
                    patches.fail(exc)
            return result
        return step

    def _ddp_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            original(module, *args, **kwargs)
            patches.ddp = True
        return init

    def _peak_reset_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches = self

        @functools.wraps(original)
        def reset(*args: Any, **kwargs: Any) -> Any:
            patches.peak_reset = True
            return original(*args, **kwargs)
        return reset


def say_to_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
