"""A plain FSDP2 training loop, written the way a user writes one, with nothing of fsdpctl in it: a
small language model on random token sequences, a DataLoader with a DistributedSampler, AdamW, and
rank 0 printing its loss every step.

    torchrun --nproc-per-node 2 fsdp2_loop.py --steps 40 [--compile] [--grad-accum 2]
        [--slow-input-rank 1 --input-delay 0.05] [--fail-at-step 5] [--save-every 20 --save-dir DIR]
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RandomTokens(Dataset):
    """Sequences of random tokens; on ``slow_rank`` every sample takes ``delay`` seconds to read."""

    def __init__(self, samples, seq_len, vocab, slow_rank=-1, delay=0.0):
        self.samples, self.seq_len, self.vocab = samples, seq_len, vocab
        self.slow = int(os.environ.get("RANK", 0)) == slow_rank
        self.delay = delay

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        if self.slow:
            time.sleep(self.delay)
        tokens = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=torch.Generator().manual_seed(index))
        return tokens[:-1], tokens[1:]


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab=512, width=128, depth=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--slow-input-rank", type=int, default=-1)
    parser.add_argument("--input-delay", type=float, default=0.0)
    parser.add_argument("--fail-at-step", type=int, default=-1)
    parser.add_argument("--save-every", type=int, default=0, help="a sharded DCP checkpoint every N steps (0: none)")
    parser.add_argument("--save-dir", default=os.path.join(os.environ.get("FSDPCTL_RUN_DIR", "."), "checkpoints"))
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = TinyLM()
    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to(device)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    data = RandomTokens(args.steps * args.grad_accum * args.batch_size * world, args.seq_len, 512,
                        args.slow_input_rank, args.input_delay)
    loader = iter(DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, shuffle=False)))
    for step in range(1, args.steps + 1):
        total = torch.zeros((), device=device)
        for _ in range(args.grad_accum):
            tokens, targets = (t.to(device) for t in next(loader))
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten()) / args.grad_accum
            loss.backward()
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step} loss {total.item():.6f}", flush=True)
        if args.save_every and step % args.save_every == 0:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state},
                     checkpoint_id=os.path.join(args.save_dir, f"step{step}"))
        if step == args.fail_at_step:
            raise RuntimeError(f"failing on purpose at step {step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
