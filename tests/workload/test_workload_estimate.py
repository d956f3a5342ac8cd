"""`fsdpctl estimate` against reality: the traced peak of a training step against the allocator's own
peak of the real step (world 2, gloo), a model of the user's, the verdicts, the JSON."""

from __future__ import annotations

import json

import pytest

import fsdpctl
from tests.conftest import run_cli

pytestmark = pytest.mark.workload

SHAPE = ["--seq-len", "128", "--batch-size", "8", "--steps", "3", "--eval-interval", "0", "--no-checkpoint",
         "--memory-report", "--mixed-precision", "fp32"]
CHOICES = (("full", []), ("grad-op", ["--sharding", "grad-op"]), ("no-shard", ["--sharding", "no-shard"]),
           ("checkpointing", ["--activation-checkpointing"]), ("bf16", ["--mixed-precision", "bf16"]))
CONFIGS = [("tiny", name, flags) for name, flags in CHOICES]  # the small preset's: test_workload_estimate_small.py


@pytest.mark.parametrize("preset, name, flags", CONFIGS, ids=[f"{p}-{n}" for p, n, _ in CONFIGS])
def test_the_estimate_is_within_12_percent_of_the_allocators_own_peak(trainer, tmp_path, preset, name, flags):
    check_against_the_allocator(trainer, tmp_path, preset, name, flags)


def check_against_the_allocator(trainer, tmp_path, preset, name, flags):
    # The allocator's own peak moves with the machine's load and with when gloo's threads let go of
    # their copies; the estimate does not (the same every time), and counts the copies gloo may still
    # hold (the top of that spread). Small bf16: 172.4 MiB on a quiet machine, 184.6 MiB under the
    # whole suite. Tiny with checkpointing: 23.1, 23.9, 25.2 and 25.4 MiB in four quiet runs, estimated
    # 26.5 (+14.6% of the first). So a measurement off by more than 12% is taken again, up to three
    # times, and one of them must be within 12%.
    offs = []
    for attempt in range(2):
        result = trainer(tmp_path / f"try{attempt}", "--preset", preset, *SHAPE, *flags, nproc=2)
        memory = result.summary()["step_memory"]
        measured = max(memory["measured_peak_bytes_per_rank"])
        estimate = memory["estimate"]
        assert memory["measured_by"] == "the CPU allocator's Total Allocated (torch.profiler)", memory
        assert estimate["traced"], estimate
        off = (estimate["peak_bytes"] - measured) / measured
        offs.append(off)
        print(f"\nestimate vs measured, {preset} {name} world 2: measured {measured / 2**20:.1f} MiB, "
              f"estimated {estimate['peak_bytes'] / 2**20:.1f} MiB ({off:+.1%}); the ZeRO formula "
              f"{estimate['model_state_bytes'] / 2**20:.1f} MiB")
        line = [text for text in result.output.splitlines() if text.startswith("Memory: ")]
        assert len(line) == 1 and f"mem_measured={measured}" in line[0], result.output[-2000:]
        if abs(off) <= 0.12:
            return
    raise AssertionError(f"the estimate is off the allocator's peak by {', '.join(f'{o:+.1%}' for o in offs)}")


def test_every_peak_of_a_second_step_lies_between_the_trace_without_gloos_copies_and_the_estimate(
        trainer, tmp_path):
    """FSDP2, full sharding, 2 ranks, batch 8 x 128 tokens of the default 5,000-token vocabulary, run
    twice (a third run cost 45 s of CI for one more sample of the same spread). The allocator's peak
    of step 2 moves with when gloo's threads let go of their copies of each collective's buffer: none
    held, the last one of each kind, or the last two. The estimate
    is the top of that spread and the same trace without the copies (a GPU's) its bottom: tiny 110.3
    and 117.7 MiB, small 313.1 and 349.0; the peaks seen here were tiny 110.3 to 117.7 and small 319.9
    to 349.0 (that one under the whole suite). Every peak must lie between the two, within 3%. Before a
    CPU trace held two copies of each kind, small was estimated at 335.4 MiB: 3.9% below a peak of
    349.0; before it started with gloo's copies of a first step, tiny at 111.1: 5.0% below 116.9. The
    small preset's spread held as tiny's in every run; it is not run here any more (80 s of CI for the
    same mechanism): its estimate's accuracy is test_workload_estimate_small.py's."""
    from fsdpctl.workload.estimate import trace

    preset = "tiny"
    peaks, estimates = [], set()
    for attempt in range(2):
        result = trainer(tmp_path / f"try{attempt}", "--preset", preset, *SHAPE, "--vocab-size", "5000", nproc=2)
        memory = result.summary()["step_memory"]
        peaks.append(max(memory["measured_peak_bytes_per_rank"]))
        estimates.add(memory["estimate"]["peak_bytes"])
    estimate = estimates.pop()
    assert not estimates, "the estimate is the same every time"
    request = {"preset": preset, "sharding": "full", "batch_size": 8, "seq_len": 128, "world": 2, "local_world": 2,
               "fsdp": 2, "vocab_size": 5000, "mixed_precision": "fp32"}
    assert trace({**request, "device": "cpu"})["peak_bytes"] == estimate, "the run's estimate is this trace"
    floor = trace({**request, "device": "cuda"})["peak_bytes"]
    print(f"\n{preset} at vocab 5000: peaks {', '.join(f'{p / 2**20:.1f}' for p in peaks)} MiB, estimated "
          f"{estimate / 2**20:.1f} MiB, {floor / 2**20:.1f} without gloo's copies")
    assert floor < estimate
    for peak in peaks:
        assert 0.97 * floor <= peak <= 1.03 * estimate, f"a peak of {peak} outside {floor}..{estimate}: {peaks}"


def test_a_cpu_trace_of_several_ranks_starts_with_glooss_copies_of_a_first_step():
    """What gloo holds from one step into the next (the last reduce-scatter's input: the unsharded
    gradients of the group reduced last, the root's) is in a CPU estimate of 2 ranks; a GPU's has no
    such copies, and one rank none to make."""
    from fsdpctl.workload.estimate import trace
    from fsdpctl.workload.model import GPT, preset_config

    request = {"preset": "tiny", "sharding": "full", "batch_size": 8, "seq_len": 128, "world": 2, "local_world": 2,
               "fsdp": 2, "vocab_size": 5000, "mixed_precision": "fp32"}
    cpu, gpu = trace({**request, "device": "cpu"}), trace({**request, "device": "cuda"})
    import torch

    with torch.device("meta"):
        model = GPT(preset_config("tiny", 5000, None))
    root = sum(p.numel() * 4 for name, p in model.named_parameters() if not name.startswith("transformer.h."))
    assert cpu["traced"] and gpu["traced"]
    assert cpu["peak_bytes"] - gpu["peak_bytes"] >= root, (cpu["peak_bytes"], gpu["peak_bytes"], root)


def test_a_users_own_model_is_estimated_and_judged(tmp_path, monkeypatch):
    """An nn.TransformerEncoder from a factory, sharded by its layers; the verdict against a GPU
    flips where the margins say."""
    (tmp_path / "my_models.py").write_text(
        "import torch.nn as nn\n\n"
        "def encoder():\n"
        "    layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)\n"
        "    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    big = fsdpctl.estimate(model="my_models:encoder", wrap="TransformerEncoderLayer", input_shape=("B", 64, 256),
                           nproc_per_node=2, batch_size=8, gpu_mem="64GiB", choices=False)
    asked = big.asked.result
    assert asked["traced"] and asked["params"] == sum((256 * 768 + 768) + (256 * 256 + 256) + 2 * 256 * 1024 + 1024
                                                      + 256 + 4 * 256 for _ in range(4)), asked
    assert asked["breakdown"]["activations"] > 0 and big.fits
    needed = big.verdict(big.asked).needed
    small = fsdpctl.estimate(model="my_models:encoder", wrap="TransformerEncoderLayer", input_shape=("B", 64, 256),
                             nproc_per_node=2, batch_size=8, gpu_mem=needed - 1, choices=False)
    assert small.fits is False and small.asked.peak == big.asked.peak


def test_estimate_json_names_every_figure_and_the_choice_that_fits(tmp_path):
    result = run_cli("estimate", "--preset", "tiny", "--nproc-per-node", "2", "--batch-size", "8", "--seq-len", "128",
                     "--gpu-mem", "2GiB", "--mixed-precision", "fp32", "--json", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert {"settings", "world", "asked", "gpu_memory_bytes", "margins", "fits", "choices", "best", "max_batch",
            "where", "seconds"} <= set(data)
    assert data["world"] == 2 and data["gpu_memory_bytes"] == 2 * 2**30 and data["where"] == "this machine"
    assert len(data["choices"]) == 12 and all(c["peak_bytes"] > 0 for c in data["choices"])
    assert [c["traced"] for c in data["choices"]].count(True) == 6  # offload is derived from the trace without it
    assert data["best"]["sharding"] == "no-shard" and not data["best"]["activation_checkpointing"]  # all fit 2 GiB
    assert data["max_batch"] > 8 and data["max_batch_peak_bytes"] > data["asked"]["peak_bytes"]
    assert len(data["margins"]["assumptions"]) == 3 and data["asked"]["model_state_bytes"] > 0
    for name in ("activations", "optimizer states", "parameters (sharded)"):
        assert data["asked"]["breakdown"][name] > 0


def test_at_one_rank_the_shardings_are_one_trace_and_the_largest_batch_still_found(tmp_path):
    result = run_cli("estimate", "--preset", "tiny", "--nproc-per-node", "1", "--batch-size", "8", "--seq-len", "128",
                     "--gpu-mem", "2GiB", "--mixed-precision", "fp32", "--json", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tracing 2 choices (1 ranks)" in result.stderr
    choices = json.loads(result.stdout)["choices"]
    traced = [(c["sharding"], c["activation_checkpointing"]) for c in choices if c["traced"]]
    assert traced == [("full", False), ("full", True)]  # the asked sharding, with and without checkpointing
    peaks = {c["activation_checkpointing"]: c["peak_bytes"] for c in choices if c["traced"]}
    for plain in (c for c in choices if not c["cpu_offload"]):
        assert plain["peak_bytes"] == peaks[plain["activation_checkpointing"]]
        assert plain["traced"] or plain["derived"] == "the same step as full: one rank shards nothing"
    data = json.loads(result.stdout)
    assert data["best"]["sharding"] == "no-shard" and data["max_batch"] > 8  # a derived best still gets its batch


def test_a_launch_that_would_not_fit_the_profiles_gpus_is_warned_before_it_starts(tmp_path, monkeypatch):
    from fsdpctl.api.estimate import memory_warning

    monkeypatch.chdir(tmp_path)

    def profile(gpu_memory: str) -> str:
        path = tmp_path / f"gpus-{gpu_memory}.yaml"
        path.write_text(f"name: gpus\nbackend: local\ndevice: cuda\nnproc_per_node: 2\ngpu_memory: {gpu_memory}\n"
                        "network:\n  interface: lo\ntrain:\n  preset: tiny\n  batch_size: 8\n  seq_len: 128\n")
        return str(path)

    small = fsdpctl.prepare(profile("1GiB"), runs_dir=tmp_path / "runs")
    warning = memory_warning(small)
    assert warning is not None and "will likely run out of memory" in warning and "fsdpctl estimate -p gpus" in warning
    assert memory_warning(fsdpctl.prepare(profile("80GiB"), runs_dir=tmp_path / "runs")) is None
    # A program of the user's is checked only when its model is named.
    (tmp_path / "train.py").write_text("print('training')\n")
    assert memory_warning(fsdpctl.prepare(profile("1GiB"), ["train.py"], runs_dir=tmp_path / "runs",
                                          code=tmp_path)) is None
