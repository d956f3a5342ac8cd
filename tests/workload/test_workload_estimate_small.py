"""`fsdpctl estimate` against the allocator's own peak for the small preset (a module of its own, so
that the test workers share the accuracy runs)."""

from __future__ import annotations

import pytest

from tests.workload.test_workload_estimate import CHOICES, check_against_the_allocator

pytestmark = pytest.mark.workload


# What each sharding changes is checked at the tiny preset; here, that the figures hold at a larger model.
SCALED = [(name, flags) for name, flags in CHOICES if name in ("full", "checkpointing", "bf16")]


@pytest.mark.parametrize("name, flags", SCALED, ids=[name for name, _ in SCALED])
def test_the_small_presets_estimate_is_within_12_percent_of_the_allocators_own_peak(trainer, tmp_path, name, flags):
    check_against_the_allocator(trainer, tmp_path, "small", name, flags)
