"""An FSDP2 script that survives `fsdpctl launch` shrinking its run (``elastic: {min_nodes: K}``) and
growing it back: the recipe of docs/guides/restarts-and-spares.md ("For elastic runs"), whole.

What makes it elastic:
1. The global batch is fixed (``--global-batch``), not the per-rank one: on ``WORLD_SIZE`` ranks each
   rank trains ``global / world`` samples a step, ``--micro-batch`` at a time, accumulating the rest.
   The same samples make up each step on any world size, so the loss goes on as if nothing happened.
2. The samples of step ``s`` are chosen by their global position, never by the rank alone.
3. It saves a sharded DCP checkpoint every ``--save-every`` steps and, started again, loads the newest
   complete one (DCP reshards it onto the new world); a checkpoint folder is complete once DCP wrote its
   ``.metadata`` (the last file ``dcp.save`` writes). fsdpctl grows a short run back right after a save.
4. It reads what fsdpctl tells every rank: ``FSDPCTL_ORIGINAL_WORLD_SIZE`` (the full-size world) and
   ``FSDPCTL_ELASTIC_ATTEMPT`` (how often the node count changed), here only to say so.
5. On the stop signal (``FSDPCTL_STOP_SIGNAL``: ``fsdpctl stop``, or a job system's SIGTERM to the
   launcher) every rank finishes its step, all of them save that step, and they exit 0: a resume goes
   on from it. The handler only takes note; the ranks agree after each step, so all stop at the same one.
"""

import argparse
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

SAMPLES, WIDTH = 4096, 64


def newest_checkpoint(folder: Path):
    done = sorted(p.parent for p in folder.glob("step_*/.metadata"))
    return done[-1] if done else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--save-every", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=48)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--fail-at", type=int, default=0, help="rank 1 raises at this step of attempt 1 (tests)")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds to sleep after each step (tests)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not split over {world} ranks")
    share = args.global_batch // world
    micro = max(d for d in range(1, min(share, args.micro_batch) + 1) if share % d == 0)
    accumulate = share // micro

    torch.manual_seed(0)  # the same data and weights on every rank and every attempt
    inputs = torch.randn(SAMPLES, WIDTH)
    targets = inputs @ torch.randn(WIDTH, WIDTH) / WIDTH ** 0.5
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
                                  for _ in range(3)), torch.nn.Linear(WIDTH, WIDTH))
    mesh = init_device_mesh(device.type, (world,))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    stop = torch.zeros(1, device=device)  # 1 once this rank got the stop signal
    signal.signal(getattr(signal, os.environ.get("FSDPCTL_STOP_SIGNAL", "SIGTERM")), lambda *_: stop.fill_(1))

    checkpoints = Path(os.environ.get("FSDPCTL_RUN_DIR", ".")) / "checkpoints"
    step, latest = 0, newest_checkpoint(checkpoints)
    if latest is not None:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(latest))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        step = int(latest.name.split("_")[1])
    if rank == 0:
        full = os.environ.get("FSDPCTL_ORIGINAL_WORLD_SIZE", str(world))
        print(f"world {world} of {full} (node count changed {os.environ.get('FSDPCTL_ELASTIC_ATTEMPT', '0')} "
              f"times): {micro} x {accumulate} samples per rank, "
              f"{'from ' + latest.name if latest else 'from scratch'}", flush=True)

    while step < args.steps:
        if args.fail_at and step + 1 == args.fail_at and rank == 1 and os.environ.get("FSDPCTL_ATTEMPT") == "1":
            raise RuntimeError(f"a program error at step {step + 1}")
        first = step * args.global_batch + rank * share  # this rank's share of the step's global batch
        total = torch.zeros((), device=device)
        for m in range(accumulate):
            rows = torch.arange(first + m * micro, first + (m + 1) * micro) % SAMPLES
            loss = (model(inputs[rows].to(device)) - targets[rows].to(device)).square().mean() / accumulate
            loss.backward()
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        dist.all_reduce(total)
        if rank == 0:
            print(f"step={step} loss={total.item() / world:.6f}", flush=True)
        time.sleep(args.pause)
        asked = stop.clone()
        dist.all_reduce(asked)  # did any rank get the stop signal? then all of them save this step and leave
        if (step % args.save_every == 0 or asked.item()) and step < args.steps:
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(checkpoints / f"step_{step:07d}"))
        if asked.item():
            if rank == 0:
                print(f"stopped after step {step}, saved", flush=True)
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
