"""The optimizer the workload builds works with the fp16 grad scaler on every device it chooses for.

CUDA's choice is exercised on CPU kernels: fused AdamW exists on CPU too, and with the sharded grad
scaler it fails there exactly as on a GPU ("output with shape [] doesn't match the broadcast shape [1]").
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from fsdpctl.workload import parallelize as par
from fsdpctl.workload.config import make_config

pytestmark = pytest.mark.workload


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_fp16_scaler_steps_the_optimizer_built_for_each_device(one_rank_group, device_type):
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    rt = par.Runtime(0, 1, 0, 1, torch.device(device_type))  # the parameters stay on the CPU
    optimizer = par.build_optimizer(make_config({}), model, rt, "fp16")
    scaler = ShardedGradScaler(device="cpu")
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        scaler.scale(model(torch.randn(4, 16)).square().mean()).backward()
        scaler.unscale_(optimizer)  # the workload unscales before clipping
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_fused_adamw_stays_where_it_works():
    assert par.fused_adamw("cuda", "bf16") and par.fused_adamw("cuda", "fp32")
    assert not par.fused_adamw("cuda", "fp16") and not par.fused_adamw("cpu", "bf16")
