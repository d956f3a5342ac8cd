"""Lightning's Trainer with FSDP2, as a user sets it up: ``ModelParallelStrategy`` and
``fully_shard`` in ``configure_model``, random token sequences, rank 0 printing its loss.

    torchrun --nnodes 2 --nproc-per-node 1 lightning_fsdp2.py --steps 20
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
        return tokens[:-1], tokens[1:]


class TinyLM(L.LightningModule):
    def __init__(self, vocab=512, width=64, depth=2):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.head = nn.Linear(width, vocab)

    def configure_model(self):
        for block in self.blocks:
            fully_shard(block, mesh=self.device_mesh["data_parallel"])
        fully_shard(self, mesh=self.device_mesh["data_parallel"])

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)

    def training_step(self, batch, batch_index):
        tokens, targets = batch
        loss = F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())
        if self.global_rank == 0:
            print(f"step {self.global_step + 1} loss {loss.item():.6f}", flush=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--grad-accum", type=int, default=1)
    args = parser.parse_args()
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    nodes = int(os.environ.get("WORLD_SIZE", 1)) // devices
    torch.manual_seed(0)
    trainer = L.Trainer(accelerator="cpu", devices=devices, num_nodes=nodes, max_steps=args.steps,
                        strategy=ModelParallelStrategy(data_parallel_size=devices * nodes, tensor_parallel_size=1),
                        accumulate_grad_batches=args.grad_accum, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    data = RandomTokens(args.steps * args.grad_accum * 4 * devices * nodes, 32, 512)
    trainer.fit(TinyLM(), DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()
