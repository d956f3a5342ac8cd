"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and the consolidated export.

Layout: ``run_dir/checkpoints/step_0000100/`` holds DCP's ``.metadata`` and one shard file per
rank (model and optimizer, via ``get_state_dict``), ``rng_rank<R>.pt`` per rank, and
``trainer_state.json`` (step, data position, grad scaler, run shape). Every rank writes into
``.tmp-step_0000100/``; after a barrier rank 0 renames it, so a directory named ``step_*`` is
always complete, and only such directories are ever resumed from.

Multi-node: every rank writes its own shard into the same directory and rank 0 renames it, so
``run_dir`` MUST be on storage that all nodes share (NFS, Lustre, a mounted bucket...). A run
whose nodes each see their own ``run_dir`` stops with an error at the first checkpoint.

DCP stores each tensor with its global shape and its shards' offsets, so a checkpoint written at
one world size (or by FSDP2) loads at another world size (or into FSDP1).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from .config import ConfigError
from .layout import CHECKPOINTS, complete_checkpoints, step_dir_name


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = complete_checkpoints(checkpoints_dir(run_dir))
    return found[-1] if found else None


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def save_checkpoint(run_dir: str | Path, step: int, model: nn.Module, optimizer, trainer_state: dict,
                    rank: int, device: torch.device, keep: int) -> Path:
    """Write step ``step`` atomically (see the module docstring) and keep the newest ``keep``."""
    root = checkpoints_dir(run_dir)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # left over from a run that died while saving
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save(_rng_state(device), tmp / f"rng_rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state), encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        # For people: the launcher reads the CHECKPOINT_SAVED row the trainer writes after the save, never this line.
        print(f"fsdpctl.workload: checkpoint step={step} saved", flush=True)
    dist.barrier()
    if not final.is_dir():
        raise ConfigError("run_dir", f"this rank cannot see checkpoint {final} that rank 0 wrote",
                          "put --run-dir on storage shared by all nodes")
    return final


def read_trainer_state(path: Path) -> dict:
    return json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))


def timed_load(path: Path, model: nn.Module, optimizer, rank: int, device: torch.device
               ) -> tuple[dict, tuple[float, float]]:
    """``load_checkpoint``, and when it began and its seconds (the goodput account's checkpoint load)."""
    began = time.time()
    state = load_checkpoint(path, model, optimizer, rank, device)
    return state, (began, time.time() - began)


def load_checkpoint(path: Path, model: nn.Module, optimizer, rank: int, device: torch.device) -> dict:
    """Restore model, optimizer and this rank's RNG from ``path``; returns the trainer state."""
    state = read_trainer_state(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    bundle = {"model": model_sd, "optim": optim_sd}
    dcp.load(bundle, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=bundle["model"],
                   optim_state_dict=bundle["optim"])
    rng_file = path / f"rng_rank{rank % int(state['world_size'])}.pt"
    rng = torch.load(rng_file, weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], device)
    return state


def export_full(path: str, model: nn.Module, rank: int, device: torch.device,
                model_config: dict) -> None:
    """Gather a consolidated state dict and ``torch.save`` it from rank 0 (plain tensors, keys of
    a plain GPT). ``PATH.json`` next to it holds the GPTConfig to build that GPT with."""
    # Rank 0 gathering full tensors onto the CPU: on CUDA offload them (memory); on CPU FSDP1
    # with cpu_offload=True crashes, and the tensors are in host memory already.
    options = StateDictOptions(full_state_dict=True, cpu_offload=device.type == "cuda")
    state = get_model_state_dict(model, options=options)
    if rank == 0:
        plain = {k: v.detach().to("cpu", copy=True) for k, v in state.items()}
        target = Path(path).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        torch.save(plain, tmp)
        os.replace(tmp, target)
        side = target.with_name(target.name + ".json")
        side.write_text(json.dumps(model_config, indent=2) + "\n", encoding="utf-8")
    dist.barrier()
