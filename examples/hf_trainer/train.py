"""Train a small GPT-2 with the Hugging Face Trainer: a plain Trainer script that also runs under torchrun.

Run it from this folder:

    fsdpctl launch -p local -- train.py --steps 10     # two CPU processes
    fsdpctl launch -p two-node -- train.py             # every GPU of two nodes

fsdpctl starts it with torchrun on every node. The Trainer reads RANK, WORLD_SIZE and the rest from
torchrun's environment and trains data-parallel over all ranks. Nothing is downloaded: the model is
made from a config and the data are random tokens. Swap in your own model and dataset.
"""

import argparse
import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(Dataset):
    """Random token sequences, the same on every rank (the Trainer gives each rank its own share)."""

    def __init__(self, samples, seq_len, vocab):
        self.samples, self.seq_len, self.vocab = samples, seq_len, vocab

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        tokens = torch.randint(0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": tokens, "labels": tokens.clone()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    # $FSDPCTL_RUN_DIR is this run's folder on each node: write outputs there (`fsdpctl fetch` brings them back).
    parser.add_argument("--output-dir", default=os.path.join(os.environ.get("FSDPCTL_RUN_DIR", "."), "hf"))
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    world = int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
    data = RandomTokens(args.steps * 4 * world, 32, config.vocab_size)

    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=5,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,  # one line per logging step, not a progress bar per rank
        ddp_find_unused_parameters=False,
        use_cpu=not torch.cuda.is_available(),  # the same script on CPUs (gloo) and GPUs (NCCL)
    )
    Trainer(model=model, args=training, train_dataset=data).train()


if __name__ == "__main__":
    main()
