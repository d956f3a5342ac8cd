"""The bare FSDP2 reference loop that bench/workload_step.py times the bundled workload against.

Same GPT, same init, AdamW, grad clipping, random tokens; nothing else (no data pipeline, no
logging, no checkpoints). Run: torchrun --nproc-per-node 2 bench/bare_fsdp2.py --steps 30
Rank 0 prints one JSON line with the median seconds per step over windows of --window steps.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fsdpctl.workload.model import GPT, preset_config

p = argparse.ArgumentParser()
p.add_argument("--preset", default="tiny")
p.add_argument("--vocab-size", type=int, default=5000)
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--seq-len", type=int, default=128)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--window", type=int, default=10)
args = p.parse_args()

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
config = preset_config(args.preset, args.vocab_size)
with torch.device("meta"):
    model = GPT(config)
mesh = init_device_mesh(device.type, (world,))
for block in model.blocks:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
model.to_empty(device=device)
model.init_weights(1337)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), fused=True if cuda else None)
gen = torch.Generator().manual_seed(rank)
data = torch.randint(0, args.vocab_size, (args.steps, args.batch_size, args.seq_len + 1), generator=gen)

times, start, start_step = [], None, 0
for step in range(args.steps):
    x, y = data[step, :, :-1].to(device), data[step, :, 1:].to(device)
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    # Time windows that end every --window steps (like the workload's log lines), after step 1.
    if step == 0 or (step + 1) % args.window == 0:
        if cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        if start is not None:
            times.append((now - start) / (step - start_step))
        start, start_step = now, step
if rank == 0:
    print(json.dumps({"median_step_time_s": statistics.median(times), "world_size": world}), flush=True)
dist.destroy_process_group()
os._exit(0)  # see fsdpctl/workload/train.py: gloo can abort in interpreter shutdown
