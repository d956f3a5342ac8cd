"""Run directories written before the backend interface existed still work with logs, status and runs.

``golden/runs-0.1.0/local-*`` is a real two-process run written by fsdpctl 0.1.0 (commit 15ebb90);
``slurm-*`` holds the plan 0.1.0 rendered for the shipped Slurm profile and a run.json with the
fields its ``submit --slurm --follow`` wrote.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli

GOLDEN = Path(__file__).parent / "golden" / "runs-0.1.0"
LOCAL_RUN = "local-20261123-091200-23a4"
SLURM_RUN = "slurm-20261123-091232-b2a3"


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """The old runs in a runs directory of the test's own; the Slurm run's shared directory holds
    what its two nodes wrote."""
    root = tmp_path / "runs"
    shutil.copytree(GOLDEN, root)
    shared = tmp_path / "shared" / SLURM_RUN
    shared.mkdir(parents=True)
    plan_path = root / SLURM_RUN / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan["run_dir"] = str(shared)  # where the nodes wrote, here instead of the cluster's shared home
    plan_path.write_text(json.dumps(plan))
    (shared / "node0.log").write_text(f"fsdpctl: node 0 of 2 on gpu7 in {shared}, attempt 1\n"
                                      "[rank0]:Train Epoch: 1  Step: 5  Loss: 4.2000 | step=5 loss=4.2000\n")
    (shared / "node1.log").write_text(f"fsdpctl: node 1 of 2 on gpu8 in {shared}, attempt 1\n")
    (shared / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 5, "loss": 4.2}) + "\n")
    return root


def test_an_old_local_run_shows_its_logs_and_status(runs_dir):
    env = {"FSDPCTL_RUNS_DIR": str(runs_dir)}
    logs = run_cli("logs", LOCAL_RUN, env=env)
    assert logs.returncode == 0, logs.stderr
    assert "[localhost r0] Train Epoch: 1  Step: 4  Loss: 8.4716 | step=4 loss=8.4716" in logs.stdout
    assert len(logs.stdout.splitlines()) == 5
    only = run_cli("logs", LOCAL_RUN, "--grep", "Validation", env=env)
    assert only.stdout.splitlines() == ["[localhost r0] Validation  Step: 4  Loss: 8.4319 | step=4 "
                                        "val_loss=8.4319 val_ppl=4591.38"]
    status = run_cli("status", LOCAL_RUN, "--json", env=env)
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["state"] == "succeeded" and info["exit_code"] == 0
    assert [(n["host"], n["state"], n["exit_code"]) for n in info["nodes"]] == [("localhost", "succeeded", 0)]


def test_an_old_slurm_run_shows_its_nodes_logs_and_status(runs_dir):
    env = {"FSDPCTL_RUNS_DIR": str(runs_dir)}
    logs = run_cli("logs", SLURM_RUN, env=env)
    assert logs.returncode == 0, logs.stderr
    assert "[gpu7 r0] Train Epoch: 1  Step: 5  Loss: 4.2000 | step=5 loss=4.2000" in logs.stdout
    assert "[gpu8] fsdpctl: node 1 of 2 on gpu8" in logs.stdout
    info = json.loads(run_cli("status", SLURM_RUN, "--json", env=env).stdout)
    assert info["state"] == "succeeded" and info["job_id"] == "7"
    assert [n["host"] for n in info["nodes"]] == ["gpu7", "gpu8"]
    assert info["last_metrics"]["step"] == 5


def test_old_runs_are_listed_with_their_backend(runs_dir):
    listed = run_cli("runs", env={"FSDPCTL_RUNS_DIR": str(runs_dir)})
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]  # under the header
    assert [(r[0], r[1], r[2]) for r in rows] == [(LOCAL_RUN, "succeeded", "local"), (SLURM_RUN, "succeeded", "slurm")]
