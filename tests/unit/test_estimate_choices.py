"""Which sharding fits: the order choices cost speed in, the margins, the verdicts, the largest batch."""

from __future__ import annotations

from fsdpctl.memory.choices import GIB, Choice, Margins, grid, largest_batch, pick, verdict, with_offload


def test_choices_run_fastest_first_and_hybrid_only_across_nodes():
    labels = [c.label() for c in grid(multi_node=False)]
    assert labels[:3] == ["no-shard", "grad-op", "full"]
    assert labels.index("full") < labels.index("no-shard + checkpointing") < labels.index("no-shard + cpu offload")
    assert labels[-1] == "full + checkpointing + cpu offload" and len(labels) == 12
    assert "hybrid" not in " ".join(labels) and "hybrid" in [c.sharding for c in grid(multi_node=True)]


def test_the_verdict_flips_where_the_margins_say():
    margins = Margins(cuda_context=GIB, nccl=GIB // 2, allocator=0.1)
    peak = 10 * GIB
    needed = peak + GIB + GIB // 2 + GIB  # context, NCCL (peers), 10 % of the peak
    assert verdict(peak, needed, margins, world=8).fits and verdict(peak, needed, margins, world=8).left == 0
    assert not verdict(peak, needed - 1, margins, world=8).fits
    assert verdict(peak, needed - GIB // 2, margins, world=1).fits  # one rank: no NCCL buffers
    assert margins.assumptions(8)[1].startswith("NCCL") and len(margins.assumptions(1)) == 2


def test_the_fastest_choice_that_fits_is_picked():
    def choice(sharding, ac, peak):
        return Choice(sharding, ac, False, {"peak_bytes": peak})

    table = [choice("no-shard", False, 70 * GIB), choice("grad-op", False, 40 * GIB), choice("full", False, 30 * GIB),
             choice("no-shard", True, 20 * GIB)]
    assert pick(table, 48 * GIB, Margins(), 8).label() == "grad-op"  # faster than checkpointing, and it fits
    assert pick(table, 24 * GIB, Margins(), 8).label() == "no-shard + checkpointing"
    assert pick(table, 10 * GIB, Margins(), 8) is None


def test_the_largest_batch_is_read_off_two_traces():
    margins = Margins(cuda_context=GIB, nccl=0, allocator=0.0)
    # 4 GiB of model state, 1 GiB per sample: 80 GiB less 1 GiB of context holds 75 samples
    assert largest_batch(8, 12 * GIB, 16, 20 * GIB, 80 * GIB, margins, world=1) == 75
    assert largest_batch(8, 12 * GIB, 8, 12 * GIB, 80 * GIB, margins, world=1) is None  # one batch size: no slope
    assert largest_batch(8, 12 * GIB, 16, 20 * GIB, 3 * GIB, margins, world=1) == 0


def test_offload_moves_the_sharded_states_to_the_host():
    base = {"peak_bytes": 10 * GIB, "breakdown": {"parameters (sharded)": GIB, "optimizer states": 2 * GIB,
                                                   "activations": 6 * GIB, "gradients (sharded)": GIB}}
    moved = with_offload(base)
    assert moved["peak_bytes"] == 6 * GIB and moved["host_bytes"] == 4 * GIB
    assert moved["breakdown"] == {"activations": 6 * GIB} and base["peak_bytes"] == 10 * GIB
