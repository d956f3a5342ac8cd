"""The GPT: preset sizes, sharding-independent init, checkpointing-independent results."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.distributed as dist

from fsdpctl.workload import parallelize as par
from fsdpctl.workload.config import make_config
from fsdpctl.workload.model import (
    GPT,
    Block,
    GPTConfig,
    count_params,
    default_batch_size,
    flops_per_token,
    preset_config,
    set_timer,
)
from fsdpctl.workload.timing import RankTimer

pytestmark = pytest.mark.workload


@pytest.mark.parametrize("preset, low, high", [
    ("tiny", 1.0e6, 2.2e6), ("small", 10e6, 20e6), ("gpt2-124m", 163.0e6, 163.2e6)])
def test_preset_sizes_at_default_vocab(preset, low, high):
    assert low <= count_params(preset_config(preset, 5000)) <= high


def test_vocab_is_padded():
    assert preset_config("tiny", 5000).vocab_size == 5056
    assert preset_config("tiny", 1024).vocab_size == 1024


def test_gpt2_keeps_its_own_vocabulary_unless_told():
    # GPT-2 124M's size whatever the tokenizer reaches: 124.4M with the head tied, 163.1M untied.
    assert preset_config("gpt2-124m", 5000).vocab_size == 50304
    assert preset_config("gpt2-124m", 60000).vocab_size == 60032  # a larger tokenizer still fits
    assert preset_config("gpt2-124m", 5000, 5056).vocab_size == 5056  # asked for: as asked
    config = preset_config("gpt2-124m", 5000)
    assert count_params(config) - config.vocab_size * config.n_embd == pytest.approx(124.4e6, rel=1e-3)


def test_default_batch_is_the_presets_on_a_gpu_and_8_on_a_cpu():
    assert default_batch_size("gpt2-124m", "cuda") == 32 and default_batch_size("gpt2-124m", "cpu") == 8
    assert all(default_batch_size(p, "cpu") == 8 for p in ("tiny", "small"))


def test_compiling_keeps_the_modules_and_their_names():
    """FSDP wraps the same blocks and checkpoints load either way: only the arithmetic is compiled
    (torch.compile is lazy, so nothing is compiled here)."""
    config = GPTConfig(vocab_size=128, n_layer=2, n_embd=32, n_head=4, block_size=16)
    plain, compiled = GPT(config), GPT(config)
    compiled.compile_compute()
    assert list(compiled.state_dict()) == list(plain.state_dict())
    assert [type(m) for m in compiled.modules()] == [type(m) for m in plain.modules()]
    assert all(block._compute is not block._forward for block in compiled.blocks)
    assert all(getattr(block._compute, "__func__", None) is Block._forward for block in plain.blocks)


def test_meta_init_equals_direct_init():
    config = GPTConfig(vocab_size=128, n_layer=2, n_embd=32, n_head=4, block_size=16)
    direct = GPT(config)
    direct.init_weights(seed=7)
    with torch.device("meta"):
        late = GPT(config)
    late.to_empty(device="cpu")
    late.init_weights(seed=7)
    for (name, a), (_, b) in zip(direct.state_dict().items(), late.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    other = GPT(config)
    other.init_weights(seed=8)
    assert not torch.equal(other.lm_head.weight, direct.lm_head.weight)
    assert direct.lm_head.weight.data_ptr() != direct.transformer.wte.weight.data_ptr()  # untied


def test_initial_loss_is_near_uniform_and_checkpointing_is_transparent():
    config = GPTConfig(vocab_size=256, n_layer=2, n_embd=32, n_head=4, block_size=16)
    model = GPT(config)
    model.init_weights(seed=0)
    x = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(0))
    logits, loss = model(x, x)
    assert logits.shape == (3, 16, 256)
    assert abs(loss.item() - math.log(256)) < 0.1
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_activation_checkpointing(True)
    _, loss2 = model(x, x)
    loss2.backward()
    assert loss2.item() == loss.item()
    assert all(torch.allclose(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert set(model.state_dict()) == set(GPT(config).state_dict())  # same names


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp2_step_with_rank_timing_hands_fsdp_no_view(one_rank_group, checkpointing):
    """The trainer's FSDP2 model, timed per rank as every run is, trains a step without FSDP2's
    "returned a view tensor" warning (an in-place op on such an output skips the all-gather), and
    the timer still brackets every block's forward and backward and the head."""
    cfg = make_config({"fsdp": 2, "activation_checkpointing": checkpointing})
    rt = par.Runtime(0, 1, 0, 1, torch.device("cpu"))
    gpt_config = GPTConfig(vocab_size=256, n_layer=2, n_embd=32, n_head=4, block_size=16)
    model = par.build_model(cfg, gpt_config, rt, "fp32")
    timer = RankTimer(rt.device)
    set_timer(model, timer)
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*returned a view tensor")
        _, loss = model(x, x)
        loss.backward()
    assert len(timer.pairs) == 2 * gpt_config.n_layer + 1  # each block forward and backward, the head
    assert not timer.open_backward  # every backward that began was seen to end
    assert timer.window()["compute_s"] > 0


def test_flops_count_what_is_multiplied():
    config = preset_config("gpt2-124m", 50257)  # padded to GPT-2's 50304
    assert config.vocab_size == 50304
    # GPT-2 small: 12 blocks of 12 * 768^2 projection weights, the 768 x 50304 head; attention per token.
    assert flops_per_token(config, 1024) == 6 * (12 * 12 * 768 ** 2 + 768 * 50304) + 12 * 12 * 768 * 1024
    # ...which is exactly every nn.Linear weight of the model: embeddings, biases and norms do no matmul.
    with torch.device("meta"):
        model = GPT(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert flops_per_token(config, 1024) == 6 * linear + 12 * 12 * 768 * 1024
    # The old count (all parameters but the position table) overstated it by the token table and the rest.
    old = 6 * (count_params(config) - 1024 * 768) + 12 * 12 * 768 * 1024
    assert old - flops_per_token(config, 1024) >= 6 * 50304 * 768
