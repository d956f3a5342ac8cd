"""Models for the benchmarks, built as a user's factory would build them (``--model MODULE:FACTORY``)."""

from fsdpctl.workload.model import GPT, GPTConfig


def gpt_1b() -> GPT:
    """A 1.4B-parameter GPT: 24 blocks of width 2048, GPT-2's padded vocabulary, 1024 tokens."""
    return GPT(GPTConfig(n_layer=24, n_head=16, n_embd=2048, block_size=1024, vocab_size=50304))
