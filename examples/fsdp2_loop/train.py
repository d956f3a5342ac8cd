"""A plain FSDP2 training loop: a small language model, a DataLoader with a DistributedSampler, AdamW.
Nothing of fsdpctl in it: it runs the same under `torchrun` and under `fsdpctl launch`. From this folder:

    fsdpctl launch -p local -- train.py --steps 10     # two CPU processes
    fsdpctl launch -p two-node -- train.py             # every GPU of two nodes
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class RandomTokens(Dataset):
    """Random token sequences: swap in your own dataset."""

    def __init__(self, samples, seq_len, vocab):
        self.samples, self.seq_len, self.vocab = samples, seq_len, vocab

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        tokens = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=torch.Generator().manual_seed(index))
        return tokens[:-1], tokens[1:]  # predict each next token


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
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank per step")
    args = parser.parse_args()

    # torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...) is all init_process_group needs.
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    # FSDP2: shard each block, then the rest of the model, over every rank.
    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyLM()
    mesh = init_device_mesh(device.type, (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    # Each rank reads its own share of the data.
    data = RandomTokens(args.steps * args.batch_size * world, 64, 512)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, shuffle=False))
    for step, (tokens, targets) in enumerate(loader, start=1):
        logits = model(tokens.to(device))
        loss = F.cross_entropy(logits.flatten(0, 1), targets.to(device).flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
