"""Train a small language model with Lightning and FSDP2: a plain Lightning script, nothing of fsdpctl in it.

Run it from this folder:

    fsdpctl launch -p local -- train.py --steps 10      # two CPU processes
    fsdpctl launch -p two-node -- train.py              # every GPU of two nodes

fsdpctl starts it with torchrun on every node. Lightning sees torchrun's environment and joins the
ranks it started. `ModelParallelStrategy` with `fully_shard` in `configure_model` is FSDP2 in
Lightning. The data are random tokens: swap in your own.
"""

import argparse
import os

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset


class RandomTokens(Dataset):
    def __init__(self, samples, seq_len, vocab):
        self.samples, self.seq_len, self.vocab = samples, seq_len, vocab

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        tokens = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=torch.Generator().manual_seed(index))
        return tokens[:-1], tokens[1:]  # predict each next token


class TinyLM(L.LightningModule):
    def __init__(self, vocab=512, width=64, depth=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def configure_model(self):
        # FSDP2: shard each block, then the rest, over every rank.
        mesh = self.device_mesh["data_parallel"]
        for block in self.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)

    def training_step(self, batch, batch_index):
        tokens, targets = batch
        loss = F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())
        if self.global_rank == 0 and (self.global_step + 1) % 5 == 0:
            print(f"step {self.global_step + 1} loss {loss.item():.4f}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    # torchrun sets these on every rank: processes on this node, and processes in all.
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    nodes = int(os.environ.get("WORLD_SIZE", 1)) // devices
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="auto",  # GPUs where there are some, else the CPU
        devices=devices,
        num_nodes=nodes,
        strategy=ModelParallelStrategy(data_parallel_size=devices * nodes, tensor_parallel_size=1),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = RandomTokens(args.steps * 4 * devices * nodes, 32, 512)
    trainer.fit(TinyLM(), DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()
