"""A small FSDP2 training script of the kind fsdpctl launches for you: `fsdpctl launch --job example`.

It is written the way a script run by fsdpctl should be:
- torchrun's environment gives it its rank and world (``init_process_group()`` needs nothing else);
- it writes what it makes under ``$FSDPCTL_RUN_DIR`` (the run's folder on each node, the same for every
  attempt of a run), so `fsdpctl fetch` and `--fetch` find it;
- it saves a sharded checkpoint every ``--save-every`` steps and, started again in the same run
  directory, continues from the newest complete one (``FSDPCTL_ATTEMPT`` says which attempt this is).
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def newest_checkpoint(folder: Path):
    """The newest step folder with a DONE marker (a save cut short has none)."""
    done = sorted(p.parent for p in folder.glob("step_*/DONE"))
    return done[-1] if done else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4)))
    mesh = init_device_mesh(device.type, (world,))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    run_dir = Path(os.environ.get("FSDPCTL_RUN_DIR", "."))
    checkpoints = run_dir / "checkpoints"
    step = 0
    latest = newest_checkpoint(checkpoints)
    if latest is not None:
        state = {"model": get_state_dict(model, optimizer)[0], "optim": get_state_dict(model, optimizer)[1]}
        dcp.load(state, checkpoint_id=str(latest))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(latest.name.split("_")[1])
    if rank == 0:
        print(f"attempt {os.environ.get('FSDPCTL_ATTEMPT', '1')}: world {world} on {device.type}, "
              f"{'resuming from ' + latest.name if latest else 'from scratch'}", flush=True)

    generator = torch.Generator().manual_seed(rank)
    while step < args.steps:
        step += 1
        x = torch.randn(32, 64, generator=generator).to(device)
        loss = (model(x) - x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step={step} loss={loss.item():.4f}", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            target = checkpoints / f"step_{step:07d}"
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(target))
            dist.barrier()
            if rank == 0:
                (target / "DONE").write_text(f"{time.time()}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
