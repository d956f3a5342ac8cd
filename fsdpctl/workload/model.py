"""A nanoGPT-style GPT (GPT-2 architecture: pre-norm blocks, learned positions, GELU MLP).

Built so that FSDP2 can construct it on the ``meta`` device: the constructor allocates nothing
that matters, and ``init_weights()`` (called after ``to_empty()``) fills every parameter. The
initial values do not depend on how the parameters are sharded: each parameter's full tensor is
drawn from one seeded CPU generator in a fixed order, and each rank keeps its own shard of it. A
single process, FSDP1 and FSDP2 at any world size therefore start from bit-identical weights.

The output head is NOT tied to the token embedding: a tied weight shared between the root and
an embedding that an FSDP1 size-based wrap policy may shard separately breaks FSDP1, and
``to_empty()`` unties shared meta parameters anyway. Untying costs vocab_size * n_embd params.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 5056
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, dict] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=512),
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}


# GPT-2's vocabulary (50257) padded to 64. The gpt2-124m preset keeps it whatever size the tokenizer
# trained on the corpus reaches (the builtin corpus stops near 18k tokens), so the model's parameters
# and FLOPs are GPT-2 124M's; rows the tokenizer never produces are simply never looked up.
PRESET_MODEL_VOCAB = {"gpt2-124m": 50304}

# Sequences per rank per micro-step when no batch size is given: 8 on a CPU; on a GPU the preset's
# own, large enough that the device, not the host launching its kernels, sets the pace (at 16 the
# gpt2-124m step is host-bound under FSDP2 on an H100; 32 x 1024 tokens fits a 40 GB GPU in bf16).
DEFAULT_BATCH = {"cpu": {"tiny": 8, "small": 8, "gpt2-124m": 8},
                 "cuda": {"tiny": 64, "small": 32, "gpt2-124m": 32}}


def default_batch_size(preset: str, device_type: str) -> int:
    """The batch size used when none is given, for this preset on this kind of device."""
    return DEFAULT_BATCH["cuda" if device_type == "cuda" else "cpu"][preset]


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """Round the tokenizer's vocabulary up so the embedding and head matrices are GPU-friendly."""
    return (vocab_size + multiple - 1) // multiple * multiple


def model_vocab_size(preset: str, tokenizer_vocab: int, requested: int | None = None) -> int:
    """Rows of the token embedding and the output head: ``requested`` if given, else the tokenizer's
    size padded to 64, and for a preset with a vocabulary of its own (gpt2-124m) at least that."""
    if requested is not None:
        return requested
    return max(padded_vocab(tokenizer_vocab), PRESET_MODEL_VOCAB.get(preset, 0))


def preset_config(preset: str, tokenizer_vocab: int, requested_vocab: int | None = None) -> GPTConfig:
    return GPTConfig(vocab_size=model_vocab_size(preset, tokenizer_vocab, requested_vocab), **PRESETS[preset])


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head = config.n_head
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """One transformer block; the unit that FSDP shards and activation checkpointing recomputes.

    Checkpointing happens inside ``forward`` so the parameter names stay the same with or
    without it (checkpoints and exports are interchangeable) and so it runs inside the FSDP unit.
    ``compile_compute()`` compiles the block's arithmetic (``_forward``) and nothing around it:
    FSDP's hooks on the block stay eager, outside the compiled code, so they cause no graph
    breaks, and the twelve blocks share one compiled graph.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)
        self.activation_checkpointing = False
        self._compute = self._forward
        self.timer = None  # a RankTimer while the trainer measures per-rank timings

    def compile_compute(self) -> None:
        self._compute = torch.compile(self._forward)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        run = self._checkpointed if self.activation_checkpointing and torch.is_grad_enabled() else self._compute
        return run(x) if self.timer is None else self.timer.block(run, x)

    def _checkpointed(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self._compute, x, use_reentrant=False)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self._head_loss = self._logits_and_loss
        self.timer = None

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.h

    def set_activation_checkpointing(self, enabled: bool) -> None:
        for block in self.blocks:
            block.activation_checkpointing = enabled

    def compile_compute(self) -> None:
        """Compile each block's arithmetic and the head with the loss (where the logits, the
        largest tensors of a step, are upcast for the loss: compiled, the upcast is fused into the
        loss instead of writing a float32 copy of the logits). Modules and parameter names stay as
        they are, so FSDP wraps the same modules and checkpoints load either way."""
        for block in self.blocks:
            block.compile_compute()
        self._head_loss = torch.compile(self._logits_and_loss)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """GPT-2 initialisation, independent of sharding (see the module docstring)."""
        generator = torch.Generator(device="cpu").manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                full = torch.zeros(param.shape)
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                full = torch.ones(param.shape)
            else:
                std = proj_std if name.endswith("c_proj.weight") else 0.02
                full = torch.empty(param.shape).normal_(0.0, std, generator=generator)
            _copy_full_into(param, full)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits for ``idx`` (B, T); with ``targets``, returns (logits, mean cross-entropy)."""
        _, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.blocks:
            x = block(x)
        if targets is None:
            return self.lm_head(self.transformer.ln_f(x))
        if self.timer is None:
            return self._head_loss(x, targets)
        return self.timer.compute(self._head_loss, x, targets)

    def _logits_and_loss(self, x: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def set_timer(model: nn.Module, timer) -> None:
    """Have every block and the head of ``model`` (however FSDP wrapped it) report to ``timer``."""
    for module in model.modules():
        if isinstance(module, (Block, GPT)):
            module.timer = timer


def _copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` into ``param``: whole for a plain tensor, this rank's shard for a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        # src_data_rank=None: every rank holds the same full tensor, so no communication.
        shard = distribute_tensor(full.to(param.device, param.dtype), param.device_mesh,
                                  param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full.to(param.device, param.dtype))


def count_params(config: GPTConfig) -> int:
    """Parameter count of a GPT with this config (built on the meta device, so free)."""
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(config).parameters())


def matmul_params(config: GPTConfig) -> int:
    """Weights that take part in a matrix multiply per token: every block's attention and MLP
    projections and the (untied) output head. Not the token and position embeddings (a lookup),
    biases or norms (element-wise)."""
    return config.n_layer * 12 * config.n_embd ** 2 + config.n_embd * config.vocab_size


def flops_per_token(config: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward and backward), PaLM appendix B: 6 per multiplied weight,
    plus attention's 12 * L * H * Q * T (scores and weighted sum, forward and backward)."""
    head_dim = config.n_embd // config.n_head
    return 6 * matmul_params(config) + 12 * config.n_layer * config.n_head * head_dim * seq_len
