"""Which sharding fits: the order choices cost speed in, the margins, the verdicts, the largest batch."""

from __future__ import annotations

import glob
import json
import os

import pytest

from fsdpctl.memory.choices import (
    GIB,
    Choice,
    Margins,
    bytes_per_sample,
    grid,
    largest_batch,
    pick,
    search_largest_batch,
    verdict,
    with_offload,
)
from tests.conftest import REPO, run_cli


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


class Traces:
    """A step's peak at each batch, as traces would give it, and which batches were asked for."""

    def __init__(self, peak_at):
        self.peak_at, self.asked = peak_at, []

    def __call__(self, batch):
        self.asked.append(batch)
        return self.peak_at(batch)


MARGINS = Margins(cuda_context=GIB, nccl=0, allocator=0.0)


def largest_that_fits(peak_at, capacity):
    return max(b for b in range(1, 10_000) if verdict(peak_at(b), capacity, MARGINS, 1).fits)


def test_a_breakdown_that_says_what_a_sample_holds_finds_the_largest_batch_in_one_trace():
    linear = Traces(lambda b: 4 * GIB + b * GIB)  # 4 GiB of model state, 1 GiB a sample
    found, traced = search_largest_batch(8, linear(8), GIB, linear, 80 * GIB, MARGINS, 1)
    assert (found, traced) == (75, 1) and linear.asked == [8, 75] == [8, largest_that_fits(linear.peak_at, 80 * GIB)]
    result = {"batch_size": 8, "breakdown": {"activations": 5 * GIB, "temporaries": 3 * GIB, "optimizer states": GIB}}
    assert bytes_per_sample(result) == GIB
    assert bytes_per_sample({"batch_size": 8, "breakdown": {"optimizer states": GIB}}) is None


@pytest.mark.parametrize("per_sample", [1.0 * GIB, 1.5 * GIB], ids=["guessed-low", "guessed-high"])
def test_a_slope_guessed_wrong_is_corrected_by_the_line_through_the_traces(per_sample):
    steep = Traces(lambda b: 4 * GIB + b * GIB * 5 // 4)  # 1.25 GiB a sample
    found, traced = search_largest_batch(8, steep(8), per_sample, steep, 80 * GIB, MARGINS, 1)
    assert found == largest_that_fits(steep.peak_at, 80 * GIB) == 60 and traced <= 2, steep.asked
    assert verdict(steep.peak_at(found), 80 * GIB, MARGINS, 1).fits


def test_without_a_breakdown_twice_the_batch_is_traced_first_and_a_curve_ends_within_its_tries():
    linear = Traces(lambda b: 4 * GIB + b * GIB)
    assert search_largest_batch(8, linear(8), None, linear, 80 * GIB, MARGINS, 1) == (75, 2)
    assert linear.asked[1:] == [16, 75]
    curved = Traces(lambda b: 4 * GIB + b * GIB + (b * b * GIB) // 64)  # grows faster than a line
    found, traced = search_largest_batch(8, curved(8), GIB, curved, 80 * GIB, MARGINS, 1, tries=4)
    assert traced <= 4 and verdict(curved.peak_at(found), 80 * GIB, MARGINS, 1).fits
    assert found >= largest_that_fits(curved.peak_at, 80 * GIB) - 3  # close, and never one that does not fit
    nothing_more = Traces(lambda b: 4 * GIB + b * 9 * GIB)
    assert search_largest_batch(8, nothing_more(8), 9 * GIB, nothing_more, 80 * GIB, MARGINS, 1) == (8, 0)
    untraceable = Traces(lambda b: None if b > 8 else 4 * GIB + b * GIB)
    assert search_largest_batch(8, untraceable(8), GIB, untraceable, 80 * GIB, MARGINS, 1) == (8, 1)


def test_offload_moves_the_sharded_states_to_the_host():
    base = {"peak_bytes": 10 * GIB, "breakdown": {"parameters (sharded)": GIB, "optimizer states": 2 * GIB,
                                                   "activations": 6 * GIB, "gradients (sharded)": GIB}}
    moved = with_offload(base)
    assert moved["peak_bytes"] == 6 * GIB and moved["host_bytes"] == 4 * GIB
    assert moved["breakdown"] == {"activations": 6 * GIB} and base["peak_bytes"] == 10 * GIB


GPU_HERE = glob.glob("/proc/driver/nvidia/gpus/*") or glob.glob("/dev/nvidia[0-9]*")


@pytest.mark.skipif(bool(GPU_HERE), reason="this machine's own GPUs are counted before nvidia-smi is asked")
def test_estimate_counts_this_machines_gpus_for_nproc_per_node_auto(tmp_path):
    """``local-gpu`` says ``nproc_per_node: auto``: one process per GPU of this machine, counted as the
    probe counts them (here: a fake nvidia-smi first on PATH); with no GPU it asks for the count."""
    from tests.testbed.fake_gpu import gpu, install, write_scenario

    scenario = tmp_path / "scenario.json"
    tools = install(tmp_path / "bin", scenario)
    write_scenario(scenario, [gpu(1), gpu(2), gpu(3)])
    env = {"PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    profile = str(REPO / "cluster_profiles" / "local-gpu.yaml")
    small = ("--preset", "tiny", "--seq-len", "32", "--batch-size", "1", "--no-choices", "--json")
    counted = run_cli("estimate", "-p", profile, *small, env=env, timeout=300)
    assert counted.returncode == 0, counted.stderr
    report = json.loads(counted.stdout)
    assert (report["nodes"], report["nproc_per_node"], report["world"]) == (1, 3, 3)
    scenario.unlink()  # now nvidia-smi fails as it does when no driver answers: no GPU here
    asked = run_cli("estimate", "-p", profile, *small, env=env, timeout=300)
    assert asked.returncode == 2 and asked.stdout == ""
    assert "how many processes per node?" in asked.stderr and "this machine has no GPU" in asked.stderr
