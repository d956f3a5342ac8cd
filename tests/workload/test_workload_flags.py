"""Every setting value that can work on CPU runs (grouped into a few runs; each value appears at
least once across FSDP1 and FSDP2), and those that cannot stop with one line and exit 2."""

from __future__ import annotations

import importlib.util
import math
import sys

import pytest

pytestmark = pytest.mark.workload

# 3 steps; evaluation and a checkpoint at step 2 and at the end exercise those paths mid-run.
SHORT = ["--steps", "3", "--eval-interval", "2", "--checkpoint-interval", "2", "--lr", "1e-3"]

COMBOS = {
    "fsdp2-grad-op-bf16-ac-offload-accum-sgd": (
        ["--fsdp", "2", "--sharding", "grad-op", "--mixed-precision", "bf16",
         "--activation-checkpointing", "--cpu-offload", "--grad-accum", "2", "--optimizer", "sgd"],
        {"version": 2, "sharding": "grad-op", "mixed_precision": "bf16",
         "reshard_after_forward": False, "cpu_offload": True, "activation_checkpointing": True}),
    "fsdp2-no-shard-fp16": (
        ["--fsdp", "2", "--sharding", "no-shard", "--mixed-precision", "fp16"],
        {"version": 2, "sharding": "no-shard", "mixed_precision": "fp16"}),
    "fsdp2-full-reshard-auto": (
        ["--fsdp", "2", "--sharding", "full", "--reshard-after-forward", "--mixed-precision", "auto"],
        {"version": 2, "sharding": "full", "mixed_precision": "fp32", "reshard_after_forward": True}),
    "fsdp1-size-post-bf16-ac-grad-op": (
        ["--fsdp", "1", "--auto-wrap", "size", "--backward-prefetch", "post",
         "--mixed-precision", "bf16", "--activation-checkpointing", "--sharding", "grad-op"],
        {"version": 1, "auto_wrap": "size", "backward_prefetch": "post", "mixed_precision": "bf16"}),
    "fsdp1-hybrid-none-fp16-accum": (
        ["--fsdp", "1", "--sharding", "hybrid", "--backward-prefetch", "none",
         "--mixed-precision", "fp16", "--grad-accum", "2", "--auto-wrap", "transformer"],
        {"version": 1, "sharding": "hybrid", "backward_prefetch": "none", "mixed_precision": "fp16"}),
}


def _check_run(result, expected: dict, steps: int = 3):
    summary = result.summary()
    for key, value in expected.items():
        assert summary["fsdp"][key] == value, key
    losses = result.losses()
    assert sorted(losses) == list(range(1, steps + 1))
    assert all(math.isfinite(v) for v in losses.values())
    assert math.isfinite(summary["final_val_loss"]) and summary["steps"] == steps
    names = sorted(p.name for p in (result.run_dir / "checkpoints").iterdir())
    assert names == ["step_0000002", f"step_{steps:07d}"]
    line = next(line for line in result.stdout.splitlines() if "step=2 " in line)
    assert "Train Epoch: 1  Step: 2  Loss: " in line and " mfu=n/a mem=" in line


@pytest.mark.parametrize("name", list(COMBOS))
def test_combination_runs_on_two_ranks(trainer, tmp_path, name):
    flags, expected = COMBOS[name]
    _check_run(trainer(tmp_path / name, *SHORT, *flags, nproc=2), expected)


def test_hybrid_fsdp2_across_two_fake_nodes(trainer, tmp_path):
    """Two torchrun agents of one process each: a (2 nodes x 1) mesh, replicate across nodes."""
    procs = trainer.torchrun_nodes(tmp_path / "hybrid", *SHORT, "--fsdp", "2", "--sharding", "hybrid",
                                   "--no-reshard-after-forward", "--mixed-precision", "bf16")
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-4000:]
    summary = (tmp_path / "hybrid" / "summary.json").read_text()
    assert '"ranks_per_node": 1' in summary and '"world_size": 2' in summary
    assert '"sharding": "hybrid"' in summary and '"reshard_after_forward": false' in summary


def test_small_preset_single_process_fsdp1_no_shard(trainer, tmp_path):
    result = trainer(tmp_path / "small", "--preset", "small", "--fsdp", "1", "--sharding", "no-shard",
                     "--steps", "2", "--eval-interval", "0", "--no-checkpoint", "--batch-size", "2")
    assert 10e6 < result.summary()["param_count"] < 20e6 and len(result.losses()) == 2


def test_epochs_on_a_text_folder(trainer, tmp_path):
    import fsdpctl.workload.data as data_module
    import fsdpctl.workload.model as model_module

    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text((data_module.__doc__ or "") * 2)
    (folder / "b.txt").write_text((model_module.__doc__ or "") * 2)
    result = trainer(tmp_path / "run", "--dataset", str(folder), "--vocab-size", "400",
                     "--steps", "none", "--epochs", "2", "--no-checkpoint", "--eval-interval", "0",
                     "--fsdp", "2", "--sharding", "grad-op", nproc=2)
    summary = result.summary()
    per_epoch = summary["total_steps"] // 2
    assert summary["total_steps"] == summary["steps"] and per_epoch >= 2
    epochs = [row["epoch"] for row in result.rows("train")]
    assert epochs == [1] * per_epoch + [2] * per_epoch
    assert summary["dataset"].startswith("path:")


def test_wikitext2_from_data_dir(trainer, tmp_path):
    import fsdpctl.workload.data as data_module

    folder = tmp_path / "wt2"
    folder.mkdir()
    text = (data_module.__doc__ or "") * 6
    for name, part in (("wiki.train.raw", text), ("wiki.valid.raw", text[:1500]),
                       ("wiki.test.raw", text[:200])):
        (folder / name).write_text(part)
    result = trainer(tmp_path / "run", "--dataset", "wikitext2", "--data-dir", str(folder),
                     "--vocab-size", "400", "--steps", "2", "--no-checkpoint")
    assert result.summary()["dataset"] == "wikitext2" and len(result.losses()) == 2


@pytest.mark.parametrize("flags, name", [
    (["--compile"], "compile"),
    (["--dataset", "wikitext2"], "dataset"),  # no --data-dir, and `datasets` is not installed
    (["--dataset", "/no/such/corpus"], "dataset"),
    (["--batch-size", "100000"], "batch_size"),
    (["--val-fraction", "0.00001"], "val_fraction"),
])
def test_single_process_errors(trainer, tmp_path, flags, name):
    if "wikitext2" in flags and importlib.util.find_spec("datasets") is not None:
        pytest.skip("datasets is installed here: this error path needs it absent")
    result = trainer(tmp_path / "run", "--steps", "2", *flags, expect_rc=2)
    assert result.error_lines() == result.stderr.strip().splitlines()
    assert len(result.error_lines()) == 1 and result.error_lines()[0].startswith(
        f"fsdpctl.workload: {name}: ")
    assert "Traceback" not in result.output


RANK_0_BEHIND = """import os, sys, time
from fsdpctl.workload import parallelize, train
if os.environ["LOCAL_RANK"] == "0":  # behind the others, as a loaded machine may leave it
    checked = parallelize.check_combination
    parallelize.check_combination = lambda *args: (time.sleep(2.0), checked(*args))[1]
train.main(sys.argv[1:])
"""


def test_torchrun_error_is_printed_once(trainer, tmp_path, monkeypatch):
    """Every rank meets the error; local rank 0 says it, and says it even when it is the last to get
    there: torchrun stops all ranks once one exits, so the others wait for it (under CI's load the
    error was once printed by nobody)."""
    script = tmp_path / "rank_0_behind.py"
    script.write_text(RANK_0_BEHIND)
    runner_module = sys.modules[type(trainer).__module__]  # the conftest pytest loaded
    command = runner_module.torchrun_cmd
    monkeypatch.setattr(runner_module, "torchrun_cmd", lambda nproc: [*command(nproc)[:-2], str(script)])
    result = trainer(tmp_path / "run", "--fsdp", "1", "--cpu-offload", nproc=2, expect_rc=None)
    assert result.returncode != 0
    assert len(result.error_lines()) == 1, result.output[-3000:]
    assert result.error_lines()[0].startswith("fsdpctl.workload: cpu_offload: ")
    assert "fsdpctl/workload/" not in result.output  # no traceback through the workload
