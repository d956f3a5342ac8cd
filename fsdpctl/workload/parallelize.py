"""Process group, setting checks, and wrapping the GPT with FSDP2 (``fully_shard``) or FSDP1.

Sharding on each version:

================  ==========================================  ===============================
--sharding        FSDP2 (``fully_shard``)                     FSDP1 (``ShardingStrategy``)
================  ==========================================  ===============================
full              1-D mesh (world,), reshard after forward    FULL_SHARD
grad-op           1-D mesh (world,), keep params to backward  SHARD_GRAD_OP
no-shard          2-D mesh (world, 1): HSDP whose shard       NO_SHARD
                  groups have one rank, i.e. pure replication
                  with a gradient all-reduce (DDP-like)
hybrid            2-D mesh (nodes, ranks per node): shard      HYBRID_SHARD on the same
                  inside a node, replicate across nodes       2-D device mesh
================  ==========================================  ===============================

FSDP2 shards each transformer block, then the root. ``reshard_after_forward`` applies to the
blocks (and is left off where a shard group has a single rank: nothing is sharded there, see
``resolve_reshard``); the root always keeps its parameters gathered from forward to backward
(backward needs them first), as FSDP2 itself does by default for a root module.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from .config import ConfigError, TrainConfig
from .model import GPT, Block, GPTConfig


@dataclass(frozen=True)
class Runtime:
    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def env_ranks() -> tuple[int, int, int, int]:
    """(rank, world, local_rank, local_world) from torchrun's variables; one process without."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return 0, 1, 0, 1
    world = int(os.environ["WORLD_SIZE"])
    return (int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("LOCAL_WORLD_SIZE", world)))


def resolve_device_type(cfg: TrainConfig) -> str:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda was asked for but torch sees no CUDA device",
                          "use --device cpu (or auto), or a CUDA build of torch on a GPU node")
    return "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) \
        else "cpu"


def resolve_precision(cfg: TrainConfig, device_type: str) -> str:
    if cfg.mixed_precision != "auto":
        return cfg.mixed_precision
    return "bf16" if device_type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def resolve_reshard(cfg: TrainConfig, world: int, local_world: int) -> bool:
    """FSDP2's ``reshard_after_forward`` for the blocks: as given, else free the gathered parameters
    after forward where they are really sharded (full: over every rank; hybrid: inside a node). A
    shard group of one rank holds whole parameters: resharding would only gather them again for
    backward (at world 1 that was 12 more gathers per step of the 124M model, for no memory)."""
    if cfg.reshard_after_forward is not None:
        return cfg.reshard_after_forward
    shard_ranks = {"full": world, "hybrid": local_world}.get(cfg.sharding, 1)
    return shard_ranks > 1


def check_combination(cfg: TrainConfig, device_type: str, world: int, local_world: int) -> None:
    """Reject settings that cannot work together here, before any process group exists."""
    from .model import PRESETS

    block_size = PRESETS[cfg.preset]["block_size"]
    if cfg.seq_len > block_size:
        raise ConfigError("seq_len", f"{cfg.seq_len} exceeds the {cfg.preset} preset's context "
                          f"length {block_size}", "lower --seq-len or pick a larger --preset")
    if cfg.fsdp == 2:
        for name, default in (("backward_prefetch", "pre"), ("auto_wrap", "transformer")):
            if getattr(cfg, name) != default:
                raise ConfigError(name, "is an FSDP1 setting and --fsdp is 2",
                                  f"drop --{name.replace('_', '-')} or use --fsdp 1")
        wanted = {"full": True, "grad-op": False}.get(cfg.sharding)
        if cfg.reshard_after_forward is not None:
            if cfg.sharding == "no-shard":
                raise ConfigError("reshard_after_forward", "means nothing with --sharding no-shard",
                                  "drop --reshard-after-forward or pick another --sharding")
            if wanted is not None and cfg.reshard_after_forward != wanted:
                other = "grad-op" if wanted else "full"
                raise ConfigError("reshard_after_forward",
                                  f"{cfg.reshard_after_forward} contradicts --sharding {cfg.sharding}",
                                  f"use --sharding {other} (or drop --reshard-after-forward)")
    elif cfg.reshard_after_forward is not None:
        raise ConfigError("reshard_after_forward", "is an FSDP2 setting and --fsdp is 1",
                          "use --sharding full (reshard) or grad-op (keep), or --fsdp 2")
    if cfg.compile and device_type != "cuda":
        raise ConfigError("compile", "torch.compile of the workload is supported on CUDA only",
                          "drop --compile on CPU")
    if cfg.cpu_offload and cfg.fsdp == 1 and device_type != "cuda":
        raise ConfigError("cpu_offload", "FSDP1's CPUOffload pins host memory, which needs an "
                          "accelerator (and on CPU the parameters already live in host memory)",
                          "drop --cpu-offload, or use --fsdp 2 (CPUOffloadPolicy works on CPU)")
    if cfg.mixed_precision == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("mixed_precision", "bf16 is not supported by this GPU",
                          "use --mixed-precision fp16 or fp32")
    if cfg.sharding == "hybrid" and world % local_world:
        raise ConfigError("sharding", f"hybrid needs the same number of ranks on every node "
                          f"(world {world} is not a multiple of {local_world})",
                          "start the same --nproc-per-node on every node")


def init_distributed(device_type: str) -> Runtime:
    """Join torchrun's process group, or make a one-rank group for a plain single process."""
    rank, world, local_rank, local_world = env_ranks()
    if device_type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ConfigError("device", f"local rank {local_rank} has no GPU (this node has "
                              f"{torch.cuda.device_count()})", "start at most one process per GPU")
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cpu:gloo,cuda:nccl"  # gloo too: small CPU-side collectives and checks
    else:
        device, backend = torch.device("cpu"), "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return Runtime(rank, world, local_rank, local_world, device)


class PeerFailed(Exception):
    """Another rank failed a collective check and reported the reason."""


def agree(rt: Runtime, fn):
    """Run ``fn`` on every rank; if it raised ConfigError anywhere, the lowest such rank re-raises
    it (to be printed) and the others raise PeerFailed, so no rank is left in a collective."""
    error, result = None, None
    try:
        result = fn()
    except ConfigError as exc:
        error = exc
    first = torch.tensor([rt.rank if error else rt.world], dtype=torch.int64)
    dist.all_reduce(first, op=dist.ReduceOp.MIN)  # CPU tensor: gloo (a group of its own on CUDA)
    if int(first) < rt.world:
        if error is not None and int(first) == rt.rank:
            raise error
        raise PeerFailed()
    return result


def check_same(rt: Runtime, name: str, text: str, problem: str, fix: str) -> None:
    """ConfigError (from rank 0 only) unless every rank passed the same ``text``."""
    value = torch.tensor([int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)])
    low, high = value.clone(), value.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    if int(low) != int(high):
        if rt.rank == 0:
            raise ConfigError(name, problem, fix)
        raise PeerFailed()


def device_mesh(cfg: TrainConfig, device_type: str, world: int, local_world: int):
    """The mesh the chosen sharding runs on (see the table above)."""
    from torch.distributed.device_mesh import init_device_mesh

    if cfg.sharding == "no-shard":
        return init_device_mesh(device_type, (world, 1), mesh_dim_names=("replicate", "shard"))
    if cfg.sharding == "hybrid":
        return init_device_mesh(device_type, (world // local_world, local_world),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def apply_fsdp2(model: nn.Module, units: Sequence[nn.Module], cfg: TrainConfig, mesh, precision: str,
                reshard: bool, pin_memory: bool) -> None:
    """``fully_shard`` each unit (the GPT's blocks), then the root, in place. Parameters stay where
    they are (on the meta device for a model built there)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict = {"mesh": mesh}
    if precision != "fp32":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=_DTYPES[precision], reduce_dtype=torch.float32)
    if cfg.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=pin_memory)
    for unit in units:
        fully_shard(unit, reshard_after_forward=reshard, **kwargs)
    # The root (embeddings, final norm, head) is needed again as soon as backward starts:
    # keep it gathered (FSDP2's own default for the root; resharding it cost ~5 % step time).
    fully_shard(model, reshard_after_forward=False, **kwargs)


def wrap_fsdp1(model: nn.Module, unit_classes: set[type], cfg: TrainConfig, precision: str,
               device: torch.device, mesh=None) -> nn.Module:
    """``FullyShardedDataParallel`` around a materialised model, each unit class wrapped (or, with
    ``auto_wrap: size``, every submodule holding at least one unit's worth of parameters)."""
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

    if cfg.auto_wrap == "transformer":
        policy = ModuleWrapPolicy(unit_classes)
    else:
        unit = next(m for m in model.modules() if type(m) in unit_classes)
        policy = functools.partial(size_based_auto_wrap_policy,
                                   min_num_params=sum(p.numel() for p in unit.parameters()))
    strategy = {"full": ShardingStrategy.FULL_SHARD, "grad-op": ShardingStrategy.SHARD_GRAD_OP,
                "no-shard": ShardingStrategy.NO_SHARD, "hybrid": ShardingStrategy.HYBRID_SHARD}
    prefetch = {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST,
                "none": None}
    mixed = None
    if precision != "fp32":
        dtype = _DTYPES[precision]
        mixed = MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32, buffer_dtype=dtype)
    return FSDP(model, auto_wrap_policy=policy, sharding_strategy=strategy[cfg.sharding],
                backward_prefetch=prefetch[cfg.backward_prefetch], mixed_precision=mixed,
                cpu_offload=CPUOffload(offload_params=True) if cfg.cpu_offload else None,
                device_id=device, use_orig_params=True,  # named params for decay groups, compile
                device_mesh=mesh if cfg.sharding == "hybrid" else None)


def build_model(cfg: TrainConfig, gpt_config: GPTConfig, rt: Runtime, precision: str) -> nn.Module:
    """The GPT, initialised from ``cfg.seed`` and wrapped by the chosen FSDP version."""
    with torch.device("meta"):
        model = GPT(gpt_config)
    model.set_activation_checkpointing(cfg.activation_checkpointing)
    if cfg.compile:
        # One compiled graph serves every block; should dynamo still specialise per block, a limit
        # below the block count would leave the last blocks eager.
        limit = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
        setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 2 * gpt_config.n_layer))
        model.compile_compute()
    mesh = device_mesh(cfg, rt.device.type, rt.world, rt.local_world)
    if cfg.fsdp == 2:
        apply_fsdp2(model, list(model.blocks), cfg, mesh, precision,
                    reshard=resolve_reshard(cfg, rt.world, rt.local_world), pin_memory=rt.is_cuda)
        model.to_empty(device="cpu" if cfg.cpu_offload else rt.device)
        model.init_weights(cfg.seed)
        return model
    model.to_empty(device=rt.device)  # FSDP1 shards a materialised model
    model.init_weights(cfg.seed)
    return wrap_fsdp1(model, {Block}, cfg, precision, rt.device, mesh)


def fused_adamw(device_type: str, precision: str) -> bool:
    """Fused AdamW on CUDA, except with fp16: the sharded grad scaler hands a fused optimizer its
    one-element found-inf tensor, which the fused kernel rejects ("output with shape [] doesn't
    match the broadcast shape [1]"); the foreach AdamW takes the scaler's own unscale-and-skip path."""
    return device_type == "cuda" and precision != "fp16"


def build_optimizer(cfg: TrainConfig, model: nn.Module, rt: Runtime, precision: str) -> torch.optim.Optimizer:
    """AdamW (fused where it works, see ``fused_adamw``) or SGD with momentum; no weight decay on
    biases and norms (chosen by name: FSDP1 flattens parameters, so their shapes cannot tell)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        plain = name.endswith("bias") or ".ln_" in name or "ln_f." in name
        (no_decay if plain else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=True if fused_adamw(rt.device.type, precision) else None)


def make_grad_scaler(precision: str, rt: Runtime):
    """fp16 needs loss scaling; ShardedGradScaler syncs inf checks across ranks for FSDP1 and
    FSDP2 (DTensor gradients) alike."""
    if precision != "fp16":
        return None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    # With FSDP2 the scaler's one-element found-inf tensors meet DTensor gradients; DTensor warns
    # that it replicates them, which is what the scaler needs.
    warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1",
                            category=UserWarning)
    return ShardedGradScaler(device=rt.device.type)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, cfg: TrainConfig, sync: bool):
    """Skip gradient reduction on the non-final micro-steps of an accumulated step."""
    if cfg.fsdp == 2:
        model.set_requires_gradient_sync(sync)  # type: ignore[operator]
        yield
    elif sync:
        yield
    else:
        with model.no_sync():  # type: ignore[operator]
            yield


def clip_gradients(model: nn.Module, cfg: TrainConfig) -> torch.Tensor:
    """Clip to ``cfg.grad_clip`` and return the global norm before clipping, as a tensor on the
    device: reading it (``float``) waits for the device, so the loop reads it only when it logs."""
    if cfg.fsdp == 1:
        return model.clip_grad_norm_(cfg.grad_clip)  # type: ignore[operator]
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def reshard_all(model: nn.Module) -> None:
    """After an eval forward (no backward), free FSDP2 parameters kept unsharded."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def local_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (local shards)."""
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    params = [local(p) for p in model.parameters()]
    grads = [local(p.grad) for p in model.parameters() if p.grad is not None]
    optim = [local(v) for state in optimizer.state.values() for v in state.values()
             if isinstance(v, torch.Tensor)]
    size = {name: sum(t.numel() * t.element_size() for t in ts)
            for name, ts in (("params", params), ("grads", grads), ("optimizer", optim))}
    size["total"] = sum(size.values())
    return size
