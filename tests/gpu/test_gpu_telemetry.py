"""The rank telemetry on CUDA/NCCL (skipped, with the reason, where torch sees no CUDA device): the
plain FSDP2 loop of tests/user_scripts, unchanged, on one GPU through the start-up hook, with NCCL's
collective timing on and off."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the GPU tests need torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"),
]

REPO = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("timing", ["0", "1"])
def test_the_loop_on_a_gpu_reports_its_steps_loss_memory_and_gpu_time(tmp_path, timing):
    env = {**os.environ, "FSDPCTL_TELEMETRY": "1", "FSDPCTL_RUN_DIR": str(tmp_path), "TORCH_NCCL_ENABLE_TIMING": timing,
           "PYTHONPATH": os.pathsep.join([str(REPO / "fsdpctl" / "node" / "startup"), str(REPO)])}
    env.pop("FSDPCTL_RANK_HOOK_PID", None)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
                           "--master-addr=127.0.0.1", f"--master-port={_port()}",
                           str(REPO / "tests" / "user_scripts" / "fsdp2_loop.py"), "--steps", "40",
                           "--batch-size", "32"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert "rank telemetry is off" not in done.stderr
    lines = [json.loads(line) for line in (tmp_path / "telemetry" / "node0.jsonl").read_text().splitlines()]
    rows = [r for r in lines if "fsdpctl_event" not in r]  # (the program's exit is an event row beside them)
    assert sum(r["steps"] for r in rows) == 40
    printed = {int(s): float(v) for s, v in re.findall(r"step (\d+) loss ([\d.]+)", done.stdout)}
    for row in rows:
        if row["steps"] == 1:
            assert abs(row["loss"] - printed[row["step"]]) <= 1e-3 * printed[row["step"]], row
    assert all(r["mem_mb"] > 0 for r in rows) and any("gpu_step_s" in r for r in rows)
    if timing == "1":
        assert all(r["comm"] == "nccl" and r["comm_s"] >= 0 for r in rows), rows  # NCCL's own durations
    else:
        assert all(r["comm"] == "nccl-untimed" and "comm_s" not in r for r in rows), rows
