"""The shipped example job (jobs/example.yaml, examples/fsdp2_minimal) runs as documented, locally."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.workload


def test_the_example_job_trains_and_brings_its_checkpoints_back(tmp_path):
    env = {**os.environ, "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "fsdpctl", "launch", "--job", str(REPO / "jobs" / "example.yaml"),
                             "--no-preflight"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "[localhost r0] step=20 loss=" in result.stdout
    assert "from scratch" in result.stdout
    # The local profile's workdir is this folder: the node's run directory is the record's own, and the
    # fetched checkpoints are named where they already are.
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "checkpoints" / "step_0000020" / "DONE").is_file()
    assert f"fetched from node 0 (localhost): 8 file(s) in {run_dir}/checkpoints" in result.stderr
    # where its seconds went, on a local run started without the preflight: no probe, no parity
    timed = subprocess.run([sys.executable, "-m", "fsdpctl", "status", "--timings", "--json"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    rows = json.loads(timed.stdout)["timeline"]
    assert [row["phase"] for row in rows] == ["startup", "plan", "stage", "agents", "torchrun", "rendezvous",
                                              "first_line", "first_step", "last_line", "exit", "logs"], rows
    done = [row["done"] for row in rows if row["phase"] not in ("last_line", "logs")]
    assert all(b >= a - 0.05 for a, b in zip(done, done[1:], strict=False)), rows
    assert all(row["nodes"] == 1 for row in rows if row["phase"] not in ("startup", "plan")), rows
