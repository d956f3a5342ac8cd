"""The workload on CUDA/NCCL (skipped, with the reason, where torch sees no CUDA device).

Each test runs the real entry point under torchrun on min(2, GPUs) processes."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the workload tests need torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"),
]

REPO = Path(__file__).resolve().parents[2]
BASE = ["--vocab-size", "1024", "--seq-len", "128", "--batch-size", "8", "--log-interval", "5",
        "--eval-steps", "2", "--eval-interval", "0"]


def _nproc() -> int:
    return min(2, torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    from fsdpctl.workload import data

    cache = tmp_path_factory.mktemp("gpu-cache")
    corpus = data.load_builtin(cache)
    data.build_tokens(corpus, 1024, data.cache_folder(cache, corpus, 1024))
    return cache


def _train(cache_dir: Path, run_dir: Path, *flags: str, nproc: int | None = None,
           expect_rc: int = 0, env: dict | None = None, base: bool = True) -> subprocess.CompletedProcess:
    nproc = nproc or _nproc()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={_port()}", "-m", "fsdpctl.workload.train",
           *(BASE if base else ["--vocab-size", "1024"]), "--cache-dir", str(cache_dir), "--run-dir", str(run_dir),
           *flags]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="4", **(env or {}))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == expect_rc, (proc.stdout + proc.stderr)[-6000:]
    return proc


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _losses(run_dir: Path) -> dict[int, float]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


@pytest.mark.parametrize("fsdp", ["2", "1"])
def test_bf16_auto_trains_and_reports_mfu(cache_dir, tmp_path, fsdp):
    _train(cache_dir, tmp_path, "--fsdp", fsdp, "--steps", "20", "--lr", "3e-3", "--no-checkpoint")
    summary = _summary(tmp_path)
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    assert summary["fsdp"]["mixed_precision"] == expected and summary["device"] == "cuda"
    losses = _losses(tmp_path)
    assert losses[20] < losses[5] and all(math.isfinite(v) for v in losses.values())
    assert summary["peak_memory_mb_per_rank"][0] > 0
    name = torch.cuda.get_device_name(0)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    mfu = [r["mfu"] for r in rows if r["kind"] == "train" and r["mfu"] is not None]
    if any(key in name for key in ("A100", "H100", "H200")):
        assert mfu and all(0 < m < 1 for m in mfu)
        assert 0 < summary["median_mfu"] < 1


@pytest.mark.parametrize("fsdp", ["2", "1"])
def test_cpu_offload_with_pinned_memory(cache_dir, tmp_path, fsdp):
    _train(cache_dir, tmp_path, "--fsdp", fsdp, "--cpu-offload", "--steps", "3", "--no-checkpoint")
    assert _summary(tmp_path)["fsdp"]["cpu_offload"] is True


@pytest.mark.parametrize("fsdp", ["2", "1"])
def test_fp16_with_grad_scaler_and_activation_checkpointing(cache_dir, tmp_path, fsdp):
    _train(cache_dir, tmp_path, "--fsdp", fsdp, "--mixed-precision", "fp16", "--activation-checkpointing",
           "--steps", "5", "--no-checkpoint")
    assert all(math.isfinite(v) for v in _losses(tmp_path).values())


def test_compile_builds_one_graph_for_every_block(cache_dir, tmp_path):
    """Each block's arithmetic and the head with the loss are compiled inside FSDP's hooks: one graph
    serves all blocks; the only recompilation is evaluation's (no grad), never one per block."""
    proc = _train(cache_dir, tmp_path, "--compile", "--steps", "8", "--eval-interval", "4", "--no-checkpoint",
                  env={"TORCH_LOGS": "recompiles"})
    assert _summary(tmp_path)["fsdp"]["compile"] is True
    output = proc.stdout + proc.stderr
    reasons = [line for line in output.splitlines() if re.search(r"\[__recompiles\]\s+- ", line)]
    recompiled = [line for line in output.splitlines() if "Recompiling function" in line]
    assert len(recompiled) <= 2, output[-4000:]  # the block's and the head's, for evaluation
    assert all("grad_mode" in line for line in reasons), output[-4000:]
    assert "recompile_limit" not in output and "cache_size_limit" not in output
    assert all(math.isfinite(v) for v in _losses(tmp_path).values())


def test_gpt2_on_a_gpu_takes_its_own_vocabulary_and_the_gpu_batch(cache_dir, tmp_path):
    nproc = _nproc()
    cmd_flags = ["--preset", "gpt2-124m", "--seq-len", "256", "--steps", "2", "--no-checkpoint"]
    _train(cache_dir, tmp_path, *cmd_flags, base=False)
    summary = _summary(tmp_path)
    assert summary["model_config"]["vocab_size"] == 50304
    assert summary["tokens_per_step"] == nproc * 32 * 256  # the preset's GPU batch of 32
    assert summary["fsdp"]["reshard_after_forward"] is (nproc > 1)  # one GPU shards nothing


def test_resume_and_export_on_gpu(cache_dir, tmp_path):
    straight, resumed = tmp_path / "a", tmp_path / "b"
    flags = ["--steps", "10", "--checkpoint-interval", "5", "--mixed-precision", "fp32"]
    _train(cache_dir, straight, *flags, "--export-full", str(straight / "full.pt"))
    (resumed / "checkpoints").mkdir(parents=True)
    os.symlink(straight / "checkpoints" / "step_0000005", resumed / "checkpoints" / "step_0000005")
    _train(cache_dir, resumed, *flags, "--resume", "--no-checkpoint")
    a, b = _losses(straight), _losses(resumed)
    assert all(abs(a[s] - b[s]) <= 1e-4 for s in b) and sorted(b) == [10]  # atomics: not bitwise
    state = torch.load(straight / "full.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in state.values())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_fsdp2_two_gpus_match_one(cache_dir, tmp_path):
    flags = ["--steps", "5", "--optimizer", "sgd", "--lr", "0.05", "--mixed-precision", "fp32",
             "--no-checkpoint"]
    _train(cache_dir, tmp_path / "one", *flags, "--batch-size", "16", nproc=1)
    _train(cache_dir, tmp_path / "two", *flags, nproc=2)
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert max(abs(one[s] - two[s]) for s in one) <= 1e-4  # TF32/cuBLAS order differences


def test_cuda_errors_are_one_line(cache_dir, tmp_path):
    proc = _train(cache_dir, tmp_path, "--fsdp", "2", "--backward-prefetch", "post", nproc=1,
                  expect_rc=1)  # torchrun reports a failed child with exit 1
    lines = [line for line in (proc.stdout + proc.stderr).splitlines()
             if line.startswith("fsdpctl.workload: backward_prefetch: ")]
    assert len(lines) == 1


def test_doctor_collectives_report_nccl_bus_bandwidth(tmp_path):
    """`fsdpctl doctor -p local-gpu --collectives`: NCCL all-reduce and all-gather timed on every GPU
    (the ranks agree on each median over gloo, beside NCCL)."""
    proc = subprocess.run([sys.executable, "-m", "fsdpctl", "doctor", "-p", "local-gpu", "--collectives", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, FSDPCTL_RUNS_DIR=str(tmp_path / "runs")))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    data = json.loads(proc.stdout)["collectives"]
    assert data["backend"] == "nccl" and data["device"] == "cuda"
    assert {row["op"] for row in data["results"]} == {"all_reduce", "all_gather"}
    assert all(row["seconds"] > 0 and row["algbw_gbps"] > 0 for row in data["results"])
