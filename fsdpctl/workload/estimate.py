"""Per-rank peak memory of one training step, traced without a GPU and without a cluster.

``python -m fsdpctl.workload.estimate '<json>'`` prints one ``fsdpctl.estimate: {json}`` line per
configuration asked (a JSON object, or a list of them). Each is the real step, the bundled GPT or
a model of the user's wrapped by FSDP2 or FSDP1 through the trainer's own functions (forward,
backward, gradient clipping, AdamW), run under ``FakeTensorMode`` with the fake process group: no
tensor is materialised, no peer exists, and torch's memory tracker counts every tensor allocated
and freed by this rank. The step is measured as a second step is, with the optimizer's states made
(an optimizer step on zero gradients: no forward or backward needed, the same peaks on a GPU). On a
CPU of several ranks, a forward and backward pass comes first too: gloo holds a copy of each
collective's buffer, and may still hold the last two of each kind (``GlooCopies``), so a second step
starts with the first step's last reduce-scatter inputs still held, and its backward peak holds them
(the tiny preset on 2 ranks: the allocator peaks at 110.3-117.7 MiB as gloo's threads let go sooner
or later, traced at 117.7). Without that pass the CPU estimate was up to 5% low there.
Where tracing fails (an operator without a fake implementation, a data-dependent op in the user's
model) the model-state formula stands in, and the result says so.

Traced on the CPU device: a faked ``cuda`` device aborts a CPU build of torch, and the tensors a
step allocates are the same on either; what a GPU adds beyond them (its context, NCCL's buffers,
the caching allocator's slack) the caller adds as named margins.

Several configurations are traced side by side, one forked process each (up to the cores this
process may use), after torch is imported once. ``--serve`` keeps the process for more: each line
on stdin is a JSON list, answered by its lines and then ``fsdpctl.estimate-done``, so that the
traces an estimate asks for one after another pay for importing torch once.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import importlib
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from . import parallelize as par
from .config import ESTIMATE_SETTINGS, ConfigError, make_config
from .forked import side_by_side
from .model import GPT, Block, count_params, default_batch_size, preset_config
from .trace_process import DONE, PREFIX

# The tracker's categories, as this estimate names them.
CATEGORIES = {
    "Sharded Param": "parameters (sharded)", "Unsharded Param": "parameters (gathered)",
    "Buffer": "buffers", "Sharded Grad": "gradients (sharded)", "Unsharded Grad": "gradients (gathered)",
    "Activation": "activations", "Temp": "temporaries", "All Gather": "communication (all-gather)",
    "Reduce Scatter": "communication (reduce-scatter)", "OptState": "optimizer states", "Inputs": "inputs",
    "Parameter": "parameters", "Gradient": "gradients", "Optstate": "optimizer states",
}


def model_state_bytes(params: int, world: int, local_world: int, sharding: str, precision: str,
                      fsdp: int = 2) -> int:
    """The ZeRO paper's count for AdamW: fp32 parameters, gradients and two moments, 16 bytes a
    parameter, divided as the sharding divides them (grad-op keeps whole parameters), plus with
    mixed precision a half-precision copy of the parameters (one copy whole: this rank's, gathered,
    at the most). Activations and temporaries are not in it: they are what the trace adds."""
    shards = {"full": world, "hybrid": local_world, "grad-op": world, "no-shard": 1}[sharding]
    params_bytes = 4 * params if sharding == "grad-op" else 4 * params // shards
    states = (4 + 8) * params // shards
    half = 2 * params // shards if precision in ("bf16", "fp16") else 0
    return params_bytes + states + half


def _user_model(spec: str) -> nn.Module:
    module_name, _, factory = spec.partition(":")
    if not module_name or not factory:
        raise ConfigError("model", f"{spec!r} is not MODULE:FACTORY", "write it as package.module:function")
    try:
        made = getattr(importlib.import_module(module_name), factory)()
    except (ImportError, AttributeError) as exc:
        raise ConfigError("model", f"{spec}: {exc}", "check the module is importable and names the function") \
            from None
    if not isinstance(made, nn.Module):
        raise ConfigError("model", f"{spec} returned a {type(made).__name__}", "return an nn.Module")
    return made


def _fake_storage(model: nn.Module) -> nn.Module:
    """Every parameter and buffer of ``model`` replaced by a fresh tensor of this fake mode (shared
    ones stay shared); ``to_empty`` would hand fake mode meta tensors, which it refuses."""
    made: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, tensor in list(module._parameters.items()):
            if tensor is not None:
                if id(tensor) not in made:
                    made[id(tensor)] = nn.Parameter(torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu"),
                                                    requires_grad=tensor.requires_grad)
                module._parameters[name] = made[id(tensor)]
        for name, tensor in list(module._buffers.items()):
            if tensor is not None:
                if id(tensor) not in made:
                    made[id(tensor)] = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
                module._buffers[name] = made[id(tensor)]
    return model


def _unit_class(model: nn.Module, name: str | None) -> type:
    for module in model.modules():
        kind = type(module)
        if name in (kind.__name__, f"{kind.__module__}.{kind.__name__}"):
            return kind
    raise ConfigError("wrap", f"{name}: no module of that class in the model",
                      "name the class of the repeated block, e.g. TransformerEncoderLayer")


def _inputs(request: dict[str, Any], vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    shape = request.get("input_shape")
    if shape:
        shape = [batch if dim in ("B", -1) else int(dim) for dim in shape]
        if request.get("input_dtype", "float32") == "int64":
            return (torch.randint(0, int(request.get("input_max") or 1000), tuple(shape)),)
        return (torch.randn(tuple(shape)),)
    return torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))


def _build(request: dict[str, Any], cfg, precision: str, mesh, world: int, local_world: int, device: str):
    """The model wrapped as the trainer wraps it (fake tensors, fake process group), its optimizer,
    its vocabulary (0 for a user's model) and the parameter count of the whole model."""
    # The GPT is built straight into fake tensors (no storage: nothing is materialised, whatever the
    # size). A user's model is built on the meta device and given fake storage after: its factory may
    # copy modules (nn.TransformerEncoder deep-copies its layer), and a fake tensor's copy belongs to a
    # fake mode of its own, which the step then refuses to mix with this one.
    if request.get("model"):
        with torch.device("meta"):
            model = _fake_storage(_user_model(request["model"]))
        unit_class = _unit_class(model, request.get("wrap"))
        if cfg.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

            apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, unit_class))
        vocab = 0
    else:
        gpt = preset_config(cfg.preset, cfg.vocab_size, cfg.model_vocab_size)
        model = GPT(gpt)
        model.set_activation_checkpointing(cfg.activation_checkpointing)
        unit_class, vocab = Block, gpt.vocab_size
    params = sum(p.numel() for p in model.parameters())
    units = [m for m in model.modules() if isinstance(m, unit_class)]
    if cfg.fsdp == 2:
        par.apply_fsdp2(model, units, cfg, mesh, precision, reshard=par.resolve_reshard(cfg, world, local_world),
                        pin_memory=False)
    else:
        model = par.wrap_fsdp1(model, {unit_class}, cfg, precision, torch.device("cpu"), mesh)
    # As the trainer builds it: fused on a GPU (one kernel, no temporaries), foreach on a CPU.
    fused = par.fused_adamw(device, precision)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if fused else None,
                                  foreach=None if fused else True)
    return model, optimizer, vocab, params


def _loss(model: nn.Module, inputs: tuple[torch.Tensor, ...], bundled: bool) -> torch.Tensor:
    if bundled:
        return model(*inputs)[1]
    out = model(*inputs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.float().mean()


class GlooCopies:
    """What gloo adds on a CPU: it copies a collective's whole buffer into a temporary of its own (an
    all-gather's output, a reduce-scatter's input), held by its work (measured on this machine: an
    8 MiB all-gather or reduce-scatter holds 8 MiB more; an all-reduce nothing). FSDP lets go of a
    work at the next collective of its kind, but gloo's worker thread may still hold the work then:
    the allocator's peaks of one step fall on 0, 1 or 2 copies of each kind alive (small at the
    default vocabulary on 2 ranks: 326.6 to 349.0 MiB as the suite's load varied; traced with the
    last two of each kind held, 349.0 MiB; with the last one, 335.4). The last ``HELD`` of each
    kind are held here: the highest of those peaks. NCCL takes nothing from PyTorch's allocator for
    these: on GPUs this is off, and NCCL's own buffers are a margin of the caller's."""

    HELD = 2

    def __init__(self):
        self.held: dict[str, collections.deque] = {}
        self.saved: dict[str, Any] = {}

    def _wrap(self, name: str, whole: str, position: int) -> None:
        """``dist.<name>``, its buffer copied: the argument ``whole`` (or at ``position``)."""
        original = getattr(dist, name, None)
        if original is None:
            return

        def collective(*args, **kwargs):
            held = self.held.setdefault(whole, collections.deque())
            while len(held) >= self.HELD:  # let go before the new copy is made: HELD alive at most
                held.popleft()
            work = original(*args, **kwargs)
            buffer = kwargs[whole] if whole in kwargs else args[position]
            held.append(torch.empty(buffer.numel(), dtype=buffer.dtype, device=buffer.device))
            return work

        self.saved[name] = original
        setattr(dist, name, collective)

    def __enter__(self):
        # torch 2.13 names them *_single; earlier ones *_tensor (FSDP calls whichever its torch has).
        for name in ("all_gather_single", "all_gather_into_tensor"):
            self._wrap(name, "output_tensor", 0)
        for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
            self._wrap(name, "input", 1)
        return self

    def __exit__(self, *exc):
        for name, original in self.saved.items():
            setattr(dist, name, original)
        self.held.clear()


def _fsdp1_tracker():
    """torch's MemTracker, without the gradient hooks it puts on every parameter it meets: FSDP1's
    parameters (views into its flat parameters) refuse them. Gradients are counted all the same, by
    when they appear (backward's temporaries) rather than by kind."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

    return Tracker()


def _step(model: nn.Module, optimizer, inputs, bundled: bool, phases: dict[str, int], tracker=None) -> None:
    """One training step as the trainer takes it; ``phases``: the peak so far after each part."""
    loss = _loss(model, inputs, bundled)
    if tracker is not None:
        phases["forward"] = _peak_total(tracker)
    loss.backward()
    if tracker is not None:
        phases["backward"] = _peak_total(tracker)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # its norm is never read: nothing data-dependent
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if tracker is not None:
        phases["optimizer step"] = _peak_total(tracker)


def _as_a_second_step(model: nn.Module, optimizer, inputs, bundled: bool, gloo: bool) -> None:
    """What a first step leaves behind for the second: the optimizer's states and, on a CPU of
    several ranks (``gloo``), gloo's copies of the first step's last collectives (a forward and
    backward pass; no optimizer step on real gradients is needed for either)."""
    if gloo:
        _loss(model, inputs, bundled).backward()
        optimizer.zero_grad(set_to_none=True)
    _make_optimizer_states(model, optimizer)


def _make_optimizer_states(model: nn.Module, optimizer) -> None:
    """The optimizer's states as a first step leaves them (AdamW's moments and step counts, shaped as
    the parameters), from one optimizer step on zero gradients: no forward or backward needed."""
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _peak_total(tracker) -> int:
    snapshot = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
    return int(snapshot.get("Total", 0))


def _peak_module(tracker, peak: int) -> str | None:
    """The innermost module whose own peak snapshot is the step's peak (FSDP2's tracker only)."""
    best = None
    for stats in getattr(tracker, "memory_tracking", {}).values():
        for state, snaps in getattr(stats, "snapshots", {}).items():
            if "PEAK" in str(state).upper() and any(
                    snap.get(torch.device("cpu"), {}).get("Total") == peak for snap in snaps) and (
                    best is None or len(stats.mod_fqn) > len(best)):
                best = stats.mod_fqn
    return best


def trace(request: dict[str, Any]) -> dict[str, Any]:
    """One configuration's traced peak (bytes per rank), where it falls, its breakdown, and the
    model-state formula beside it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    started = time.monotonic()
    world, local_world = int(request["world"]), int(request.get("local_world") or request["world"])
    settings = {k: request[k] for k in ESTIMATE_SETTINGS if request.get(k) is not None}
    cfg = make_config({**settings, "device": "cpu"})
    device = request.get("device", "cuda")
    batch = cfg.batch_size or default_batch_size(cfg.preset, device)
    precision = cfg.mixed_precision if cfg.mixed_precision != "auto" else ("bf16" if device == "cuda" else "fp32")
    result: dict[str, Any] = {"request": request, "batch_size": batch, "precision": precision, "traced": False}
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    params = None
    try:
        mesh = par.device_mesh(cfg, "cpu", world, local_world)  # outside fake mode: it reads its ranks' values
        with FakeTensorMode():
            model, optimizer, vocab, params = _build(request, cfg, precision, mesh, world, local_world, device)
            inputs = _inputs(request, vocab, batch, cfg.seq_len)
            tracker = FSDPMemTracker(model, optimizer) if cfg.fsdp == 2 else _fsdp1_tracker()
            if cfg.fsdp == 1:
                tracker.track_external(model, optimizer)
            phases: dict[str, int] = {}
            bundled = not request.get("model")
            gloo = GlooCopies() if device == "cpu" else contextlib.nullcontext()
            with gloo:
                with tracker:  # the tracker sees what is left made, and counts the states as the optimizer's
                    _as_a_second_step(model, optimizer, inputs, bundled, device == "cpu" and world > 1)
                tracker.reset_mod_stats()
                with tracker:  # the step, measured: entering again starts the peak from what is held now
                    _step(model, optimizer, inputs, bundled, phases, tracker)
                snapshot = tracker.get_tracker_snapshot("peak").get(torch.device("cpu"), {})
        breakdown: dict[str, int] = {}
        for kind, size in snapshot.items():
            name = CATEGORIES.get(str(getattr(kind, "value", kind)), str(getattr(kind, "value", kind)))
            if name != "Total" and size:
                breakdown[name] = breakdown.get(name, 0) + int(size)
        peak = int(snapshot.get("Total", sum(breakdown.values())))
        phase = next(name for name, value in phases.items() if value >= peak)
        module = _peak_module(tracker, peak) if phase != "optimizer step" else None
        if cfg.cpu_offload:  # the sharded states live in host memory; the device holds the rest
            host = sum(breakdown.pop(k, 0) for k in ("parameters (sharded)", "gradients (sharded)",
                                                     "optimizer states"))
            peak -= host
            result["host_bytes"] = host
        result.update(traced=True, peak_bytes=peak, breakdown=breakdown, phase=phase, module=module)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to trace falls back to the formula, said so
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        result["error"] = f"{type(exc).__name__}: {message}"[:400]
    finally:
        dist.destroy_process_group()
    if params is None and not request.get("model"):
        params = count_params(preset_config(cfg.preset, cfg.vocab_size, cfg.model_vocab_size))
    result["params"] = params
    if params:
        result["model_state_bytes"] = model_state_bytes(params, world, local_world, cfg.sharding, precision, cfg.fsdp)
        if not result["traced"]:
            result["peak_bytes"] = result["model_state_bytes"]
    result["seconds"] = round(time.monotonic() - started, 2)
    return result


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return trace(request)
    except ConfigError as exc:
        return {"request": request, "traced": False, "refused": str(exc)}


def trace_all(requests: Sequence[dict[str, Any]], workers: int | None = None) -> list[dict[str, Any]]:
    """Every request's answer, in order, traced side by side (``forked.side_by_side``): torch and
    the tracer are imported once, before the fork."""
    return side_by_side(_answer, requests, workers,
                        lambda request: {"request": request, "traced": False, "error": "its trace process died"})


def _preload() -> None:
    """What every trace imports (1.7 s here), imported before the traces are forked: once, not once
    per trace process. Then what exists is frozen (``gc.freeze``): a trace makes tens of thousands of
    objects, and its collections no longer walk torch's import-time ones each time."""
    import torch._subclasses.fake_tensor  # noqa: F401
    import torch.distributed._tools.fsdp2_mem_tracker  # noqa: F401
    import torch.testing._internal.distributed.fake_pg  # noqa: F401

    gc.freeze()


def _print(answers: list[dict[str, Any]]) -> None:
    for answer in answers:
        print(f"{PREFIX}: {json.dumps(answer)}", flush=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    _preload()
    if argv[:1] == ["--serve"]:
        for line in sys.stdin:
            if line.strip():
                _print(trace_all(json.loads(line)))
                print(DONE, flush=True)
        return
    try:
        requests = json.loads(argv[0])
    except (IndexError, ValueError) as exc:
        print(f"{PREFIX}: give the configurations as one JSON argument ({exc})", file=sys.stderr)
        sys.exit(2)
    _print(trace_all(requests if isinstance(requests, list) else [requests]))


if __name__ == "__main__":
    main()
