"""The wrappers fsdpctl puts on torch in a rank of a user's program, feeding a ``StepTracker``.

- the global optimizer step hooks (``torch.optim.optimizer``): where a step ends;
- ``Tensor.backward`` and ``torch.autograd.backward``: backward calls and their scalars (the loss),
  through ``GradScaler.scale``'s output back to its unscaled input; ``GradScaler.step``: a step the
  scaler skipped;
- ``_BaseDataLoaderIter.__next__`` (torch's DataLoader, and the loaders built on it): the wait for a
  batch, and its tokens where the batch shows them;
- the collectives of ``torch.distributed`` and ``Work.wait``, the outermost call of each thread: the
  time spent in them (real waiting with gloo; with NCCL only the launch, so it is not used there),
  and how many operations they issued on the process groups (the rest of a step's operations ran
  where no wrapper sees them: inside compiled code, or in torch's C++);
- ``DistributedDataParallel.__init__``: DDP's gradient all-reduce runs in C++, out of sight;
- ``torch.cuda.reset_peak_memory_stats``: a program that resets the peak (fsdpctl never does).

The program must behave as under plain torchrun, so:

- every wrapper calls the original whatever happens, and while dynamo traces
  (``torch.compiler.is_compiling()``) it is nothing but that call: dynamo inlines it and meets the
  original, which its own tables know (a collective inside ``torch.compile(fullgraph=True)`` is
  traced as it would be without fsdpctl). ``torch.distributed._functional_collectives`` keeps the
  originals as the keys of its table of traceable collectives, whenever it is imported. A wrapper's
  own frame, run eagerly after a graph break, is skipped by dynamo as torch's own functions are
  (``skip_own_frames``): no compile is tried on it, and no graph break is counted for it;
- a function that stands under several names (``dist.all_reduce`` and ``c10d.all_reduce``) gets one
  wrapper, set under each of them, so the names stay the same object;
- an attribute is set back only while it still holds fsdpctl's wrapper: a wrapper the program (or a
  profiler) put over it later stays, and fsdpctl's, under it, passes straight through once off;
- an error of fsdpctl's own turns every wrapper off (``Patches.fail``) and never reaches the
  program: not from a hook, not in place of a collective's own exception.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any, Optional

from .steps import StepTracker

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_single", "all_gather_into_tensor",
               "all_gather_coalesced", "all_gather_object", "reduce_scatter", "reduce_scatter_single",
               "reduce_scatter_tensor", "_reduce_scatter_base", "_all_gather_base", "broadcast",
               "broadcast_object_list", "barrier", "monitored_barrier", "all_to_all", "all_to_all_single", "reduce",
               "gather", "gather_object", "scatter", "scatter_object_list", "send", "recv", "batch_isend_irecv")
OWN_MODULES = ("fsdpctl.node.telemetry.patches", "fsdpctl.node.telemetry.steps", "fsdpctl.node.telemetry.device",
               "fsdpctl.node.telemetry.reporter", "fsdpctl.node.telemetry.windows", "fsdpctl.node.profiling")
"""The modules whose code runs on the program's own threads (the wrappers, and what they call)."""
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

    def __init__(self, tracker: StepTracker, say: Callable[[str], None],
                 compiling: Callable[[], bool] = lambda: False):
        """``compiling``: whether dynamo is tracing now (``torch.compiler.is_compiling``)."""
        self.tracker = tracker
        self.say = say
        self.compiling = compiling
        self.off = False
        self.ddp = False
        self.peak_reset = False
        self.local = threading.local()
        self.scaled: list[tuple[Any, Any]] = []
        self._set: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)
        self._handles: list[Any] = []
        self._groups: Optional[Callable[[], Any]] = None  # the process groups there are (c10d's map)

    # ---- on and off ------------------------------------------------------------------------------
    def fail(self, exc: BaseException) -> None:
        """An error of fsdpctl's own: every wrapper off, one line in the rank's log."""
        if self.off:
            return
        self.off = True
        try:
            self.undo()
            self.say(f"fsdpctl: rank telemetry is off for this rank ({type(exc).__name__}: {exc}); "
                     "the program goes on unchanged")
        except Exception:  # noqa: BLE001, S110 - nothing of fsdpctl's reaches the program, not even this
            pass

    def undo(self) -> None:
        """Every attribute set back that still holds fsdpctl's wrapper (one the program wrapped again
        keeps the program's wrapper, which calls fsdpctl's, which passes through once ``off``)."""
        for owner, name, original, wrapper in reversed(self._set):
            if getattr(owner, name, None) is wrapper:
                setattr(owner, name, original)
        self._set.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _wrap(self, owners: Any, name: str, make: Callable[[Any], Any]) -> None:
        """One wrapper of ``owners[0].name``, set on each owner where that same function stands."""
        owners = owners if isinstance(owners, tuple) else (owners,)
        original = getattr(owners[0], name, None)
        if original is None:
            return
        wrapper = make(original)
        for owner in owners:
            if getattr(owner, name, None) is original:
                setattr(owner, name, wrapper)
                self._set.append((owner, name, original, wrapper))

    def originals(self) -> dict[Any, Any]:
        """Each wrapper of fsdpctl's, to the function it wraps."""
        return {wrapper: original for _, _, original, wrapper in self._set}

    def keep_remaps_original(self, functional: Any) -> None:
        """``torch.distributed._functional_collectives`` was imported: its table of the collectives
        dynamo may trace (and the names it was built from) holds the originals, as without fsdpctl."""
        try:
            originals = self.originals()
            table = getattr(functional, "traceable_collective_remaps", None)
            if isinstance(table, dict):
                for key in [k for k in table if k in originals]:
                    table[originals[key]] = table.pop(key)
            for name, value in list(vars(functional).items()):
                if name.startswith("legacy_") and value in originals:
                    setattr(functional, name, originals[value])
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    def skip_own_frames(self, dynamo: Any) -> None:
        """``torch._dynamo`` was imported: a frame of fsdpctl's that runs outside a traced function
        (a wrapper run eagerly after a graph break, the tracker it tells) is left to run as it is,
        as dynamo leaves torch's own functions, while the frames it calls (the original, the
        program's own) are dynamo's as ever. Traced from inside a compiled function, a wrapper is
        still inlined, and passes through to the original."""
        try:
            from torch._dynamo.eval_frame import skip_code
        except Exception:  # noqa: BLE001 - a torch without it: dynamo traces the frames (same results)
            return
        try:
            for code in own_codes(OWN_MODULES):
                skip_code(code)
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)

    # ---- install ---------------------------------------------------------------------------------
    def install(self) -> None:
        """Every wrapper, on the torch this process imported (raises where torch lacks one of them:
        the caller then undoes what was done)."""
        from torch.optim import optimizer

        self._handles = [optimizer.register_optimizer_step_pre_hook(self._optimizer_pre),
                         optimizer.register_optimizer_step_post_hook(self._optimizer_post)]
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
                self._wrap((c10d, dist), name, self._comm_wrapper)
            self._wrap(torch._C._distributed_c10d.Work, "wait", self._comm_wrapper)
            from torch.nn.parallel import distributed as ddp

            self._wrap(ddp.DistributedDataParallel, "__init__", self._ddp_wrapper)
            world = getattr(c10d, "_world", None)
            if world is not None and hasattr(world, "pg_map"):
                self._groups = lambda: world.pg_map
        from torch.amp import grad_scaler

        self._wrap(grad_scaler.GradScaler, "scale", self._scale_wrapper)
        self._wrap(grad_scaler.GradScaler, "step", self._scaler_step_wrapper)
        if hasattr(torch, "cuda"):
            self._wrap((torch.cuda.memory, torch.cuda), "reset_peak_memory_stats", self._peak_reset_wrapper)

    def group_operations(self) -> Optional[int]:
        """The operations issued on every process group of this process so far (their sequence
        numbers added up, whoever issued them: a wrapper, compiled code, torch's C++); None where a
        group does not say."""
        if self._groups is None:
            return None
        try:
            return sum(group._get_sequence_number_for_group() for group in list(self._groups()))
        except Exception:  # noqa: BLE001 - a backend without sequence numbers: not counted
            self._groups = None
            return None

    # ---- the hooks -------------------------------------------------------------------------------
    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.compiling() and not self.off:
            try:
                self.tracker.optimizer_starts(optimizer)
            except Exception as exc:  # noqa: BLE001 - torch would raise it into the program's step
                self.fail(exc)
        return None

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.compiling() and not self.off:
            try:
                if self.tracker.optimizer_ended(optimizer) is not None:
                    self.scaled.clear()
            except Exception as exc:  # noqa: BLE001
                self.fail(exc)
        return None

    def _backward_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches, compiling = self, self.compiling

        @functools.wraps(original)
        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling() or patches.off:
                return original(tensors, *args, **kwargs)
            local = patches.local
            if getattr(local, "in_backward", False):
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
        patches, compiling = self, self.compiling

        @functools.wraps(original)
        def next_batch(iterator: Any) -> Any:
            if compiling() or patches.off or not patches.tracker.training_thread():
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
        patches, compiling = self, self.compiling

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if compiling() or patches.off:
                return original(*args, **kwargs)
            local = patches.local
            if getattr(local, "in_comm", False):
                return original(*args, **kwargs)
            local.in_comm = True
            before = patches.group_operations()
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                local.in_comm = False
                try:
                    seconds, after = time.perf_counter() - began, patches.group_operations()
                    patches.tracker.comm(seconds, after - before if after is not None and before is not None
                                         else 0)
                except Exception as exc:  # noqa: BLE001 - never in place of the collective's own exception
                    patches.fail(exc)
        return timed

    def _scale_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches, compiling = self, self.compiling

        @functools.wraps(original)
        def scale(scaler: Any, outputs: Any, *args: Any, **kwargs: Any) -> Any:
            scaled = original(scaler, outputs, *args, **kwargs)
            if compiling() or patches.off:
                return scaled
            try:
                if getattr(outputs, "numel", None) is not None and outputs.numel() == 1:
                    patches.scaled = [*patches.scaled[-(SCALED_KEPT - 1):], (scaled, outputs.detach())]
            except Exception as exc:  # noqa: BLE001
                patches.fail(exc)
            return scaled
        return scale

    def _scaler_step_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches, compiling = self, self.compiling

        @functools.wraps(original)
        def step(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling() or patches.off:
                return original(scaler, *args, **kwargs)
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
        patches, compiling = self, self.compiling

        @functools.wraps(original)
        def init(module: Any, *args: Any, **kwargs: Any) -> None:
            original(module, *args, **kwargs)
            if not compiling():
                patches.ddp = True
        return init

    def _peak_reset_wrapper(self, original: Callable[..., Any]) -> Callable[..., Any]:
        patches, compiling = self, self.compiling

        @functools.wraps(original)
        def reset(*args: Any, **kwargs: Any) -> Any:
            if not compiling():
                patches.peak_reset = True
            return original(*args, **kwargs)
        return reset


def own_codes(modules: tuple[str, ...]) -> set[types.CodeType]:
    """The code objects of every function, method and closure defined in ``modules`` (imported)."""
    found: set[types.CodeType] = set()

    def walk(code: types.CodeType) -> None:
        if code not in found:
            found.add(code)
            for const in code.co_consts:
                if isinstance(const, types.CodeType):
                    walk(const)

    def take(value: Any, module: str) -> None:
        value = getattr(value, "__func__", value)  # staticmethod, classmethod
        if isinstance(value, property):
            for part in (value.fget, value.fset, value.fdel):
                if part is not None:
                    take(part, module)
        elif isinstance(getattr(value, "__code__", None), types.CodeType) and value.__module__ == module:
            walk(value.__code__)

    for name in modules:
        module = sys.modules.get(name)
        for value in vars(module).values() if module is not None else ():
            if isinstance(value, type) and value.__module__ == name:
                for member in vars(value).values():
                    take(member, name)
            else:
                take(value, name)
    return found


def say_to_stderr(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
