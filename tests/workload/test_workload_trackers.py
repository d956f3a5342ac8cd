"""W&B and MLflow with no line of user code, for real: the bundled workload launched on the local
backend with a profile's ``export`` section logs to W&B offline and to an MLflow file store, and what
they hold is read back (MLflow with its own client, the offline ``.wandb`` file with wandb's own reader,
``wandb leet inspect --json``); a restart and a resume stay under the run's one parent run; a node
without the tracker's package ends the run at its start in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.workload.conftest import VOCAB, child_env

pytestmark = pytest.mark.workload

PROFILE = """name: tracked
backend: local
device: cpu
nproc_per_node: {nproc}
network:
  interface: lo
workdir: {workdir}
env:
  MLFLOW_ALLOW_FILE_STORE: "true"   # MLflow 3 refuses a file store unless told it may
  OMP_NUM_THREADS: "1"
train:
  preset: tiny
  vocab_size: {vocab}
  seq_len: 32
  batch_size: 4
  eval_steps: 2
  cache_dir: {cache}
export:
{export}"""
BOTH = "  wandb: {{project: t, mode: offline}}\n  mlflow: {{tracking_uri: '{uri}', experiment: t}}\n"


def write_profile(tmp_path: Path, token_cache: Path, *, nproc: int = 2, export: str = BOTH) -> tuple[Path, str]:
    uri = f"file://{tmp_path}/mlruns"
    path = tmp_path / "tracked.yaml"
    # workdir is the runs folder's parent: the node's run directory is the record's own (one machine).
    path.write_text(PROFILE.format(nproc=nproc, workdir=tmp_path, vocab=VOCAB, cache=token_cache,
                                   export=export.format(uri=uri)))
    return path, uri


def launcher_env(tmp_path: Path) -> dict[str, str]:
    """This environment without any W&B or MLflow settings of the machine's, the file store allowed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    return {**env, "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(REPO),
            "MLFLOW_ALLOW_FILE_STORE": "true", "HOME": str(tmp_path / "home")}


def mlflow_runs(uri: str) -> tuple[object, list]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return client, client.search_runs([client.get_experiment_by_name("t").experiment_id])


def wandb_records(run_file: Path) -> list[dict]:
    """The records of an offline run's .wandb file, read by wandb's own reader (wandb-core's)."""
    read = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                          capture_output=True, text=True, timeout=120)
    assert read.returncode == 0, read.stderr[-2000:]
    return [json.loads(line) for line in read.stdout.splitlines() if line.strip()]


def test_the_bundled_workload_logs_to_wandb_offline_and_to_mlflow_under_the_runs_parent(tmp_path, token_cache,
                                                                                         monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the store back
    profile, uri = write_profile(tmp_path, token_cache)
    (tmp_path / "home").mkdir()
    done = subprocess.run([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile), "--steps", "6",
                           "--set", "log_interval=2", "--set", "eval_interval=3"],
                          cwd=tmp_path, env=launcher_env(tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    run_id = run_dir.name
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}
    val_losses = {r["step"]: r["val_loss"] for r in rows if r["kind"] == "val"}
    assert sorted(losses) == [2, 4, 6] and sorted(val_losses) == [3, 6]

    client, runs = mlflow_runs(uri)
    (parent,) = [r for r in runs if r.data.tags.get("fsdpctl.run_id") == run_id]
    assert f"mlflow: parent run {parent.info.run_id}" in done.stderr
    assert parent.info.run_name == run_id and parent.info.status == "FINISHED"
    assert parent.data.tags["fsdpctl.profile"] == "tracked" and parent.data.tags["fsdpctl.backend"] == "local"
    (child,) = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert child.info.run_name == f"{run_id}-rank0" and child.info.status == "FINISHED" and len(runs) == 2
    assert child.data.params["preset"] == "tiny" and child.data.params["steps"] == "6"
    history = {m.step: m.value for m in client.get_metric_history(child.info.run_id, "loss")}
    assert history == losses
    assert {m.step: m.value for m in client.get_metric_history(child.info.run_id, "val_loss")} == val_losses
    assert {"rank0/compute_s", "rank1/comm_s", "tokens_per_s", "step_time_s"} <= set(child.data.metrics)

    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")  # WANDB_DIR: the run's directory
    records = wandb_records(run_file)
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["run_group"] == run_id and run["display_name"] == f"{run_id}-rank0" and run["project"] == "t"
    assert run["config"]["update"]["steps"] == 6
    items = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert {i["_step"]: i["loss"] for i in items if "loss" in i} == losses
    assert {i["_step"]: i["val_loss"] for i in items if "val_loss" in i} == val_losses
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]


RESTARTS = """import os, sys
print(f"parent={os.environ['FSDPCTL_MLFLOW_PARENT_RUN_ID']} attempt={os.environ['FSDPCTL_ATTEMPT']}", flush=True)
sys.exit(3 if os.environ["FSDPCTL_ATTEMPT"] == "1" else 0)
"""


def test_a_restart_and_a_resume_stay_under_the_runs_one_parent(tmp_path, token_cache, monkeypatch, isolated_home):
    pytest.importorskip("mlflow")
    import fsdpctl
    from fsdpctl.rundir.lines import LogLine

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.chdir(tmp_path)
    profile, uri = write_profile(tmp_path, token_cache, nproc=1,
                                 export="  mlflow: {{tracking_uri: '{uri}', experiment: t}}\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(RESTARTS)
    lines: list[str] = []

    def heard(event) -> None:
        if isinstance(event, LogLine):
            lines.append(event.text)

    run = fsdpctl.launch(profile, ["train.py"], code=code, max_restarts=1, preflight=False, on_event=heard,
                         runs_dir=tmp_path / "runs")
    assert run.info.state == "succeeded" and run.attempt == 2
    run.resume(preflight=False, on_event=heard)
    assert run.info.state == "succeeded" and run.attempt == 3
    parents = {line.split()[0] for line in lines if line.startswith("parent=")}
    attempts = [line.split()[1] for line in lines if line.startswith("parent=")]
    assert attempts == ["attempt=1", "attempt=2", "attempt=3"] and len(parents) == 1, lines
    _, runs = mlflow_runs(uri)
    (parent,) = runs
    assert parents == {f"parent={parent.info.run_id}"}
    assert parent.data.tags["fsdpctl.run_id"] == run.run_id and parent.info.status == "FINISHED"


def test_a_node_without_the_trackers_package_ends_the_run_at_its_start_in_one_line(tmp_path, token_cache):
    hidden = tmp_path / "hidden" / "wandb"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'wandb'\")\n")
    env = child_env(tmp_path / "run")
    env.update({"FSDPCTL_LOG_TO": "wandb", "PYTHONPATH": os.pathsep.join([str(hidden.parent), env["PYTHONPATH"]])})
    done = subprocess.run([sys.executable, "-m", "fsdpctl.workload.train", "--preset", "tiny", "--steps", "2",
                           "--vocab-size", str(VOCAB), "--cache-dir", str(token_cache), "--run-dir",
                           str(tmp_path / "run")], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("fsdpctl.workload: ")]
    assert errors == ["fsdpctl.workload: export.wandb: the run logs to wandb and it cannot be imported on this node "
                      "(No module named 'wandb'); pip install wandb on every node (or drop export.wandb)"]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # before any training
