"""summary.json holds every figure the benchmarks read, under the names they read it by."""

from __future__ import annotations

import importlib.util
import math

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.workload


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_benchmark_reads_a_real_summary(adamw_runs):
    run = adamw_runs["fsdp2"]
    summary = run.summary()
    row = load_bench("gpu_workload").summary_row(run.run_dir)
    assert row["tokens_per_s"] > 0 and min(row["peak_memory_mb_per_rank"]) > 0 and row["time_to_first_step_s"] > 0
    assert math.isfinite(row["final_train_loss"])
    assert row["mfu"] is None and summary["peak_flops_per_device"] is None  # a CPU has no known peak
    assert summary["flops_per_token"] > 0 and "median_mfu" in summary
    # one figure per log window, and the spread of those after the first
    assert len(row["window_tokens_per_s"]) == len(run.rows("train"))
    assert row["model_vocab_size"] == summary["model_config"]["vocab_size"]

