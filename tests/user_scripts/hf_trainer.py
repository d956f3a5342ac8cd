"""The Hugging Face Trainer, as a user starts it: a tiny GPT-2 made from a config (nothing
downloaded), random token sequences, ``Trainer.train()``. On a CPU the Trainer runs DDP over gloo.

    torchrun --nproc-per-node 2 hf_trainer.py --steps 20 [--grad-accum 2] [--save-steps 10] [--eval-steps 8]
             --output-dir DIR
"""

import argparse
import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, samples, seq_len, vocab):
        self.samples, self.seq_len, self.vocab = samples, seq_len, vocab

    def __len__(self):
        return self.samples

    def __getitem__(self, index):
        tokens = torch.randint(0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": tokens, "labels": tokens.clone()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--save-steps", type=int, default=0, help="a checkpoint every N steps (0: none)")
    parser.add_argument("--eval-steps", type=int, default=0, help="an evaluation every N steps (0: none)")
    parser.add_argument("--output-dir", default=os.path.join(os.environ.get("FSDPCTL_RUN_DIR", "."), "hf"))
    args = parser.parse_args()
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4,
                                 gradient_accumulation_steps=args.grad_accum, learning_rate=1e-3, logging_steps=1,
                                 save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
                                 eval_strategy="steps" if args.eval_steps else "no", eval_steps=args.eval_steps or None,
                                 per_device_eval_batch_size=4, report_to=[], use_cpu=True, ddp_backend="gloo",
                                 disable_tqdm=True, dataloader_num_workers=0, seed=0)
    world = int(os.environ.get("WORLD_SIZE", 1))
    data = RandomTokens(args.steps * args.grad_accum * 4 * world, 32, config.vocab_size)
    held_out = RandomTokens(16 * world, 32, config.vocab_size) if args.eval_steps else None
    Trainer(model=model, args=training, train_dataset=data, eval_dataset=held_out).train()


if __name__ == "__main__":
    main()
