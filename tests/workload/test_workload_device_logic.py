"""The GPU path's decisions, checked where no GPU is: resharding, batch defaults, copies, GC, backends."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from fsdpctl.workload import collectives, train
from fsdpctl.workload.config import make_config
from fsdpctl.workload.parallelize import resolve_reshard

pytestmark = pytest.mark.workload


@pytest.mark.parametrize("sharding, world, local_world, expected", [
    ("full", 1, 1, False),      # one rank holds whole parameters: nothing to free, only gathers to redo
    ("full", 2, 2, True),
    ("full", 16, 8, True),
    ("hybrid", 4, 1, False),    # shard groups of one rank per node
    ("hybrid", 16, 8, True),
    ("grad-op", 8, 8, False),
    ("no-shard", 8, 8, False),
])
def test_fsdp2_reshards_after_forward_only_where_parameters_are_sharded(sharding, world, local_world, expected):
    assert resolve_reshard(make_config({"sharding": sharding}), world, local_world) is expected


def test_an_explicit_reshard_setting_is_kept_at_any_world_size():
    assert resolve_reshard(make_config({"reshard_after_forward": True}), 1, 1) is True
    assert resolve_reshard(make_config({"reshard_after_forward": False}), 8, 8) is False


def test_the_batch_size_left_open_is_the_devices_and_an_explicit_one_is_kept():
    assert train.with_device_defaults(make_config({"preset": "gpt2-124m"}), "cuda").batch_size == 32
    assert train.with_device_defaults(make_config({"preset": "gpt2-124m"}), "cpu").batch_size == 8
    assert train.with_device_defaults(make_config({"preset": "tiny", "batch_size": 3}), "cuda").batch_size == 3


def test_a_cpu_batch_is_used_in_place():
    array = np.arange(12, dtype=np.int64).reshape(3, 4)
    tensor = train.to_device(array, torch.device("cpu"))
    assert tensor.data_ptr() == array.ctypes.data  # no copy on a CPU


def test_training_steps_run_without_automatic_gc_and_leave_it_as_it_was():
    assert gc.isenabled()
    with train.steady_gc():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), train.steady_gc():
        raise RuntimeError("a step failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_nccl_collectives_keep_gloo_beside_them_for_the_ranks_agreement():
    assert collectives.process_group_backend(True) == "cpu:gloo,cuda:nccl"
    assert collectives.process_group_backend(False) == "gloo"
