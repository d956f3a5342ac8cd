"""``estimate``: a training step's peak memory per GPU, traced, for the choice asked and for every
sharding / checkpointing / offload choice; which of them fit the GPUs, the fastest that does, and
the largest batch it takes. The figures a sweep script can ask for before it launches."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Union

from ..errors import UsageError
from ..memory.choices import (
    Choice,
    Margins,
    Verdict,
    bytes_per_sample,
    grid,
    pick,
    search_largest_batch,
    verdict,
    with_offload,
)
from ..workload.config import ESTIMATE_SETTINGS
from .events import Emitter, EventHandler
from .prepare import ProfileLike, load_profile

if TYPE_CHECKING:
    from ..backends.base import Backend, TraceNode
    from ..memory.runner import TracesHere


@dataclass(frozen=True)
class EstimateReport:
    """What ``estimate`` found: ``asked`` (the configuration asked, its ``result`` the traced figures),
    the GPU memory it is held to (None: not known), the ``choices`` with their figures (empty without
    a GPU memory, or with ``choices=False``), the fastest choice that fits (``best``) and the largest
    batch it takes."""

    asked: Choice
    request: dict[str, Any]
    world: int
    nodes: int
    nproc_per_node: int
    gpu_memory: Optional[int]
    margins: Margins
    choices: tuple[Choice, ...] = ()
    best: Optional[Choice] = None
    max_batch: Optional[int] = None
    max_batch_result: dict[str, Any] = field(default_factory=dict)
    where: str = "this machine"
    seconds: float = 0.0

    def verdict(self, choice: Choice) -> Optional[Verdict]:
        """The choice's peak against the GPU memory with the margins (None: no GPU memory known)."""
        if self.gpu_memory is None or choice.peak is None:
            return None
        return verdict(choice.peak, self.gpu_memory, self.margins, self.world)

    @property
    def fits(self) -> Optional[bool]:
        """Whether the configuration asked fits the GPUs (None: their memory is not known)."""
        judged = self.verdict(self.asked)
        return None if judged is None else judged.fits

    def to_json(self) -> dict[str, Any]:
        """The estimate as ``estimate --json`` prints it."""
        def entry(choice: Choice) -> dict[str, Any]:
            judged = self.verdict(choice)
            result = choice.result
            return {"sharding": choice.sharding, "activation_checkpointing": choice.activation_checkpointing,
                    "cpu_offload": choice.cpu_offload, "peak_bytes": choice.peak,
                    "traced": bool(result.get("traced")) and choice.derived is None,
                    "derived": choice.derived, "breakdown": result.get("breakdown", {}),
                    "phase": result.get("phase"), "module": result.get("module"),
                    "model_state_bytes": result.get("model_state_bytes"), "host_bytes": result.get("host_bytes"),
                    "error": result.get("error"), "needed_bytes": judged.needed if judged else None,
                    "fits": judged.fits if judged else None, "left_bytes": judged.left if judged else None}

        return {"settings": {k: v for k, v in self.request.items() if v is not None},
                "world": self.world, "nodes": self.nodes, "nproc_per_node": self.nproc_per_node,
                "batch_size": self.asked.result.get("batch_size"), "precision": self.asked.result.get("precision"),
                "params": self.asked.result.get("params"), "asked": entry(self.asked),
                "gpu_memory_bytes": self.gpu_memory,
                "margins": {**self.margins.to_json(), "assumptions": self.margins.assumptions(self.world)},
                "fits": self.fits, "choices": [entry(c) for c in self.choices],
                "best": entry(self.best) if self.best else None, "max_batch": self.max_batch,
                "max_batch_peak_bytes": self.max_batch_result.get("peak_bytes"), "where": self.where,
                "seconds": round(self.seconds, 2)}


def estimate(profile: Optional[ProfileLike] = None, *, preset: Optional[str] = None, model: Optional[str] = None,
             wrap: Optional[str] = None, input_shape: Optional[tuple[Union[int, str], ...]] = None,
             input_dtype: str = "float32", nodes: Optional[int] = None, nproc_per_node: Optional[int] = None,
             fsdp: Optional[int] = None, sharding: Optional[str] = None, mixed_precision: Optional[str] = None,
             activation_checkpointing: Optional[bool] = None, cpu_offload: Optional[bool] = None,
             batch_size: Optional[int] = None, seq_len: Optional[int] = None,
             gpu_mem: Union[str, int, None] = None, choices: bool = True, margins: Optional[Margins] = None,
             timeout: float = 900.0, on_event: Optional[EventHandler] = None,
             train: Optional[Mapping[str, Any]] = None) -> EstimateReport:
    """Trace one training step of the bundled GPT (``preset``) or of a model of yours (``model``:
    ``package.module:factory`` returning an ``nn.Module``, ``wrap`` the class FSDP shards,
    ``input_shape`` its input, ``B`` standing for the batch) as it runs on ``nodes`` x
    ``nproc_per_node`` GPUs, and say how much memory each GPU needs. Settings not given come from
    ``profile`` (its ``train`` section, its hosts, its GPUs' memory) and then the workload's defaults.
    With the GPUs' memory known (``gpu_mem`` such as ``"80GiB"``, or the profile's), every choice of
    sharding, activation checkpointing and CPU offload is traced too (unless ``choices=False``), and
    the fastest one that fits is picked with the largest batch it takes. The trace runs where torch
    is: here, or else on the profile's first node. ``train``: the workload's settings to start from
    (default: the profile's train section; a run's resolved settings before a launch)."""
    started = time.monotonic()
    emit = Emitter(on_event)
    loaded = load_profile(profile) if profile is not None else None
    prof = loaded.profile if loaded is not None else None
    given = {"preset": preset, "fsdp": fsdp, "sharding": sharding, "mixed_precision": mixed_precision,
             "activation_checkpointing": activation_checkpointing, "cpu_offload": cpu_offload,
             "batch_size": batch_size, "seq_len": seq_len}
    request = _request(train if train is not None else prof.train if prof is not None else {}, given,
                       model=model, wrap=wrap, input_shape=input_shape, input_dtype=input_dtype)
    world = _uneven_world(prof, nproc_per_node) if nodes is None else None
    nodes, nproc = _layout(prof, nodes, nproc_per_node)
    world = world or nodes * nproc
    request.update(world=world, local_world=nproc, device="cpu" if prof and prof.device == "cpu" else "cuda")
    capacity = _capacity(gpu_mem, prof)
    margins = margins or Margins()
    traces = _Tracer(prof, timeout, emit)
    try:
        return _estimate(request, nodes, nproc, world, capacity, margins, choices, traces, emit, started)
    finally:
        traces.close()


def _estimate(request: dict[str, Any], nodes: int, nproc: int, world: int, capacity: Optional[int],
              margins: Margins, choices: bool, traces: _Tracer, emit: Emitter, started: float) -> EstimateReport:
    asked = _choice(request)
    if not choices or capacity is None:
        asked = replace(asked, result=traces.run([request])[0])
        return EstimateReport(asked, request, world, nodes, nproc, capacity, margins, where=traces.where,
                              seconds=time.monotonic() - started)
    table = grid(multi_node=nodes > 1)
    traced = _distinct(table, asked, world)
    emit.notice(f"estimate: tracing {len(traced)} choices ({world} ranks) on {traces.where_now()}")
    results = traces.run([{**request, "sharding": c.sharding, "activation_checkpointing": c.activation_checkpointing,
                           "cpu_offload": False} for c in traced])
    by_key = {c.key: replace(c, result=r) for c, r in zip(traced, results, strict=True)}
    for c in table:
        if c.key in by_key or c.cpu_offload:
            continue
        # one rank: every sharding holds the whole model, and the traces are the same step
        same = next(t for t in traced if t.activation_checkpointing == c.activation_checkpointing)
        by_key[c.key] = replace(c, result=by_key[same.key].result,
                                derived=f"the same step as {same.sharding}: one rank shards nothing")
    for c in table:
        if c.cpu_offload:
            base = by_key[(c.sharding, c.activation_checkpointing, False)]
            by_key[c.key] = replace(c, result=with_offload(base.result), derived="from the same choice without offload")
    filled = tuple(by_key[c.key] for c in table)
    if asked.key in by_key and not asked.cpu_offload:
        asked = by_key[asked.key]
    else:
        asked = replace(asked, result=traces.run([request])[0])
    best = pick(filled, capacity, margins, world)
    max_batch, max_result = None, {}
    if best is not None and not best.cpu_offload:  # an offload choice is derived, not traced
        max_batch, max_result = _largest_batch(best, request, traces, capacity, margins, world)
    return EstimateReport(asked, request, world, nodes, nproc, capacity, margins, filled, best, max_batch,
                          max_result, traces.where, time.monotonic() - started)


def _distinct(table: list[Choice], asked: Choice, world: int) -> list[Choice]:
    """The choices that need a trace of their own: those without offload (offload is derived from
    them); at one rank, one sharding per checkpointing setting (the asked one's, else full), since
    no sharding changes what a single rank holds."""
    plain = [c for c in table if not c.cpu_offload]
    if world > 1:
        return plain
    sharding = asked.sharding if asked.sharding in {c.sharding for c in plain} else "full"
    return [c for c in plain if c.sharding == sharding]


def _request(train: Mapping[str, Any], given: dict[str, Any], *, model: Optional[str], wrap: Optional[str],
             input_shape: Optional[tuple[Union[int, str], ...]], input_dtype: str) -> dict[str, Any]:
    """What is traced: the settings that shape a step's memory, given ones over ``train``'s; a model
    of the user's instead of the bundled GPT's preset."""
    if model and given.get("preset"):
        raise UsageError("estimate: --preset and --model together", "give one: the bundled GPT's size, or your model")
    if model and not wrap:
        raise UsageError("estimate --model: which module does FSDP shard?", "give --wrap CLASS (e.g. its block class)")
    if model and not input_shape:
        raise UsageError("estimate --model: what goes into it?", "give --input-shape, e.g. B,1024,768 (B: the batch)")
    request: dict[str, Any] = {k: train.get(k) for k in ESTIMATE_SETTINGS if k in train}
    request.update({k: v for k, v in given.items() if v is not None})
    if model:
        request.pop("preset", None)
        request.update(model=model, wrap=wrap, input_shape=list(input_shape or ()), input_dtype=input_dtype)
    return request


def _choice(request: dict[str, Any]) -> Choice:
    return Choice(request.get("sharding") or "full", bool(request.get("activation_checkpointing")),
                  bool(request.get("cpu_offload")))


def _uneven_world(prof, nproc: Optional[int]) -> Optional[int]:
    """The ranks of a profile whose hosts run different numbers of them (``hosts[].nproc``, chosen
    GPUs): their sum; None when every node runs the same (or ``nproc`` is given for all)."""
    if prof is None or nproc is not None:
        return None
    own = [h.nproc or len(h.chosen_gpus) or None for h in prof.hosts]
    if not any(own):
        return None
    rest = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else None
    counts = [mine or rest or h.gpu_count for mine, h in zip(own, prof.hosts, strict=True)]
    return sum(counts) if all(counts) else None


def _layout(prof, nodes: Optional[int], nproc: Optional[int]) -> tuple[int, int]:
    """Nodes and processes per node: as given, else the profile's; ``nproc_per_node: auto`` is one
    process per GPU, as many as the profile names or, where the backend can count them (this
    machine's), as the nodes have."""
    why = "the profile says auto and names no GPU count"
    if prof is not None:
        from ..backends import backend_class, backend_for

        placed, gpus = backend_class(prof.backend).layout(prof)
        nodes = placed if nodes is None else nodes
        if nproc is None:
            nproc = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else gpus
        if nproc is None and prof.device != "cpu":
            backend = backend_for(prof)
            try:
                counted = backend.count_gpus()
            finally:
                backend.close()
            nproc = counted or None
            why = "the profile says auto and this machine has no GPU" if counted == 0 else why
    if nproc is None:
        raise UsageError("estimate: how many processes per node?", f"give --nproc-per-node ({why})")
    if nodes is not None and nodes < 1 or nproc < 1:
        raise UsageError("estimate: --nodes and --nproc-per-node must be 1 or more", "give positive counts")
    return nodes or 1, nproc


def _capacity(gpu_mem, prof) -> Optional[int]:
    from ..profiles.schema import size_bytes

    if isinstance(gpu_mem, int):
        return gpu_mem
    text = gpu_mem if gpu_mem is not None else (prof.gpu_memory if prof is not None else None)
    if text is None:
        return None
    try:
        return size_bytes(text)
    except ValueError:
        raise UsageError(f"estimate --gpu-mem {text!r}: not a size", "write it like 80GiB, 81559MiB or 24GB") from None


def _largest_batch(best: Choice, request: dict[str, Any], traces: _Tracer, capacity: int, margins: Margins,
                   world: int) -> tuple[Optional[int], dict[str, Any]]:
    """The largest batch the best choice takes, guessed from its own trace's breakdown (what each
    sample holds at the peak) and traced to confirm it, the guess corrected by the line through the
    traces where it was off (``memory.choices.search_largest_batch``)."""
    batch = best.result.get("batch_size")
    if not batch or best.peak is None:
        return None, {}
    settings = {**request, "sharding": best.sharding, "activation_checkpointing": best.activation_checkpointing,
                "cpu_offload": best.cpu_offload}
    results = {batch: best.result}

    def peak_at(size: int) -> Optional[int]:
        results[size] = traces.run([{**settings, "batch_size": size}])[0]
        return results[size].get("peak_bytes") if results[size].get("traced") else None

    found, _ = search_largest_batch(batch, best.peak, bytes_per_sample(best.result), peak_at, capacity, margins,
                                    world)
    return found, results[found]


class _Tracer:
    """Runs traces here when this machine has torch, else on the profile's first node."""

    def __init__(self, prof, timeout: float, emit: Emitter):
        from ..memory.runner import torch_here

        self.prof, self.timeout, self.emit = prof, timeout, emit
        self.local = torch_here()
        self.where = "this machine" if self.local else None
        self._here: Optional[TracesHere] = None

    def close(self) -> None:
        """Ends the trace process kept here, if one was started."""
        if self._here is not None:
            self._here.close()

    def where_now(self) -> str:
        if self.where is None:
            self.where = self._node_name()
        return self.where

    def _node_name(self) -> str:
        backend = self._backend()
        try:
            return self._node(backend).name
        finally:
            backend.close()

    def _backend(self) -> Backend:
        from ..backends import backend_for

        if self.prof is None:
            raise UsageError("estimate: torch is not installed here, and no profile names a node that has it",
                             "run it where torch is, or give -p with a profile whose nodes have torch")
        return backend_for(self.prof)

    @staticmethod
    def _node(backend: Backend) -> TraceNode:
        node = backend.trace_node()
        if node is None:
            raise UsageError(f"estimate: torch is not installed here, and the {backend.name} backend has no node "
                             "to trace it on", "run it where torch is, or give -p with an SSH profile whose nodes "
                             "have torch")
        return node

    def run(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from ..memory import runner

        if self.local:
            if self._here is None:
                self._here = runner.TracesHere()
            return self._here.run(requests, self.timeout)
        self.where_now()
        backend = self._backend()
        try:
            node = self._node(backend)
            return runner.run_on_node(node.transport, node.python, requests, self.timeout)
        finally:
            backend.close()


def memory_warning(prepared) -> Optional[str]:
    """Before a launch: the warning to show when one training step of the bundled workload (or of
    the model named with ``model=``) would not fit the profile's GPUs; None when it fits or cannot
    be judged (no GPU memory in the profile, a CPU run, a program with no model named)."""
    from ..profiles.schema import size_bytes

    prof, plan, job = prepared.loaded.profile, prepared.plan, prepared.job
    if prof.gpu_memory is None or prof.device == "cpu" or (plan.command and not job.model):
        return None
    nproc = int(plan.nproc_per_node) if str(plan.nproc_per_node).isdigit() else None
    uneven = "+" in str(plan.nproc_per_node)  # the placed hosts' own counts give the world
    loaded = replace(prepared.loaded, profile=prepared.placed_profile) if uneven and prepared.placed_profile \
        else prepared.loaded
    train = {"batch_size": plan.train.get("batch_size")} if job.model else plan.train
    try:
        report = estimate(loaded, choices=False, nodes=None if uneven else plan.num_nodes, nproc_per_node=nproc,
                          model=job.model, wrap=job.wrap, input_shape=job.input_shape or None, train=train)
    except UsageError as exc:
        return f"memory not checked: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - the check informs; it never stops a launch
        return f"memory not checked: {type(exc).__name__}: {exc}"
    if report.fits is not False:
        return None
    judged = report.verdict(report.asked)
    return (f"one training step needs about {judged.needed / 2**30:.1f} GiB per GPU (peak "
            f"{report.asked.peak / 2**30:.1f} GiB + margins) and the profile's GPUs have "
            f"{size_bytes(prof.gpu_memory) / 2**30:.1f} GiB: it will likely run out of memory; "
            f"`fsdpctl estimate -p {prof.name}` shows the choices that fit")
