"""What ``status`` and ``runs`` show of a run, from run directories as fsdpctl writes them; and the
Slurm backend's record of a job's state, written by whoever asks Slurm (``status``, ``runs``) so
that every view reads the same state."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.conftest import run_cli

GOLDEN = Path(__file__).parent / "golden" / "runs-0.1.0"
LOCAL_RUN = "local-20261123-091200-23a4"
SLURM_RUN = "slurm-20261123-091232-b2a3"


def copy_run(runs: Path, name: str, shared: Path, **record: object) -> Path:
    """A golden run in ``runs``, its nodes' directory at ``shared`` (here), run.json changed by ``record``."""
    run = runs / name
    shutil.copytree(GOLDEN / name, run)
    plan = json.loads((run / "plan.json").read_text())
    plan["run_dir"] = str(shared)
    (run / "plan.json").write_text(json.dumps(plan))
    shared.mkdir(parents=True, exist_ok=True)
    data = {**json.loads((run / "run.json").read_text()), **record}
    (run / "run.json").write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return run


def test_status_prints_the_loss_as_the_workload_does(tmp_path):
    shared = tmp_path / "shared"
    copy_run(tmp_path / "runs", LOCAL_RUN, shared)
    (shared / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 60, "loss": 7.384543180465698}) + "\n")
    shown = run_cli("status", LOCAL_RUN, env={"FSDPCTL_RUNS_DIR": str(tmp_path / "runs")})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"{LOCAL_RUN}: succeeded; last step 60 loss 7.3845"


def test_runs_is_a_table_with_a_header_and_json_for_scripts(tmp_path):
    runs = tmp_path / "runs"
    copy_run(runs, LOCAL_RUN, tmp_path / "local")  # 09:12:00 to 09:12:16
    started = datetime.now(timezone.utc) - timedelta(hours=1, minutes=2, seconds=5)
    copy_run(runs, SLURM_RUN, tmp_path / "slurm", state="running", exit_code=None, finished_at=None,
             slurm_state=None, submitted_at=started.isoformat(timespec="seconds"), attempt=2,
             backend="nosuchbackend")  # a backend not installed here: listed as recorded, nothing asked
    env = {"FSDPCTL_RUNS_DIR": str(runs)}
    table = run_cli("runs", env=env)
    assert table.returncode == 0 and table.stderr == "", table.stderr
    header, local, slurm = table.stdout.splitlines()
    assert header.split() == ["RUN", "ID", "STATE", "BACKEND", "NODES", "STARTED", "DURATION", "EXIT", "ATTEMPT"]
    local_start = datetime.fromisoformat("2026-11-23T09:12:00+00:00").astimezone().strftime("%Y-%m-%d %H:%M")
    assert local.split() == [LOCAL_RUN, "succeeded", "local", "1", *local_start.split(), "16s", "0", "1"]
    assert slurm.split()[:4] == [SLURM_RUN, "running", "nosuchbackend", "2"]
    assert slurm.split()[6:] == ["1h02m", "-", "2"]  # a live run: to now
    columns = [header.index(name) for name in ("STATE", "STARTED", "DURATION", "EXIT", "ATTEMPT")]
    for row in (local, slurm):  # aligned: every value starts under its heading
        assert all(row[at - 1] == " " and row[at] != " " for at in columns), row
    listed = json.loads(run_cli("runs", "--json", env=env).stdout)
    assert [(r["run_id"], r["state"], r["exit_code"], r["attempt"], r["num_nodes"]) for r in listed] == [
        (LOCAL_RUN, "succeeded", 0, 1, 1), (SLURM_RUN, "running", None, 2, 2)]
    assert listed[0]["started_at"] == "2026-11-23T09:12:00+00:00" and listed[0]["duration_s"] == 16.0
    assert listed[0]["ended_at"] == "2026-11-23T09:12:16+00:00" and listed[1]["ended_at"] is None
    assert 3725 <= listed[1]["duration_s"] < 3725 + 60
    empty = run_cli("runs", env={"FSDPCTL_RUNS_DIR": str(tmp_path / "none")})
    assert empty.returncode == 0 and empty.stdout == "" and "no runs in" in empty.stderr
    assert run_cli("runs", "--json", env={"FSDPCTL_RUNS_DIR": str(tmp_path / "none")}).stdout.strip() == "[]"


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (40.7, "40s"), (307, "5m07s"), (3720, "1h02m"),
                                               (2 * 86400 + 3 * 3600 + 59, "2d03h")])
def test_durations_read_as_a_person_reads_them(seconds, text):
    from fsdpctl.cli.status import duration_text

    assert duration_text(seconds) == text


class FakeSlurm:
    """Slurm's client as the records module asks it: one squeue for many jobs, then scontrol/sacct per job."""

    def __init__(self, queue: dict[str, str], ended: dict[str, tuple[str, int]]):
        self.queue, self.ended, self.asked = queue, ended, []

    def queue_states(self, job_ids, timeout=0):
        self.asked.append(("squeue", tuple(job_ids)))
        return {job: state for job, state in self.queue.items() if job in job_ids}

    def job_state(self, job_id, requeueable=False):
        from fsdpctl.backends.slurm.client import JobState

        self.asked.append(("scontrol", job_id))
        if job_id in self.queue:
            return JobState(self.queue[job_id], None, False)
        state, code = self.ended[job_id]
        return JobState(state, code, True)


def slurm_run(tmp_path: Path, name: str, job_id: str, **record: object):
    from fsdpctl.rundir.rundir import load_run

    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    folder = name.replace("b2a3", f"b2a{job_id}")
    shutil.copytree(GOLDEN / name, runs / folder)
    for file in ("plan.json", "run.json"):
        data = json.loads((runs / folder / file).read_text())
        data.update(run_id=folder, **({"run_dir": str(tmp_path / folder)} if file == "plan.json" else {}))
        if file == "run.json":
            data.update({"job_id": job_id, "state": "submitted", "exit_code": None, "finished_at": None,
                         "slurm_state": None, **record})
        (runs / folder / file).write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    (tmp_path / folder).mkdir()
    return load_run(runs / folder)


def test_one_squeue_brings_every_live_slurm_run_up_to_date(tmp_path, monkeypatch):
    import fsdpctl
    from fsdpctl.backends.slurm import client

    queued = slurm_run(tmp_path, SLURM_RUN, "1")
    running = slurm_run(tmp_path, SLURM_RUN, "2")
    ended = slurm_run(tmp_path, SLURM_RUN, "3")  # squeue no longer lists it: asked on its own
    stopped = slurm_run(tmp_path, SLURM_RUN, "4", state="stopped", stopped_at="2026-11-23T09:21:00+00:00")
    fake = FakeSlurm({"1": "PENDING", "2": "RUNNING"}, {"3": ("COMPLETED", 0), "4": ("CANCELLED", 0)})
    monkeypatch.setattr(client, "queue_states", fake.queue_states)
    monkeypatch.setattr(client, "job_state", fake.job_state)
    listed = {run.run_id: run.info for run in fsdpctl.runs(runs_dir=tmp_path / "runs")}
    [(command, jobs), *each] = fake.asked
    assert command == "squeue" and sorted(jobs) == ["1", "2", "3"]  # the stopped run is not asked of
    assert each == [("scontrol", "3")]
    assert [str(listed[r.run_id].state) for r in (queued, running, ended, stopped)] == [
        "submitted", "running", "succeeded", "stopped"]
    assert listed[ended.run_id].exit_code == 0 and ended.record.finished_at
    assert [str(n.state) for n in running.record.nodes] == ["running", "running"]
    assert running.record.job["slurm_state"] == "RUNNING"
    status = fsdpctl.get_run(running.run_id, runs_dir=tmp_path / "runs").status()
    assert str(status.state) == "running" and status.job["slurm_state"] == "RUNNING"


def test_a_look_at_a_live_job_never_overwrites_an_end_recorded_since(tmp_path):
    from fsdpctl.backends.slurm.client import JobState
    from fsdpctl.backends.slurm.records import record_job_state
    from fsdpctl.rundir.state import RunState

    run = slurm_run(tmp_path, SLURM_RUN, "5")
    run.change(state=RunState.STOPPED)  # `fsdpctl stop` wrote this after squeue answered RUNNING
    assert record_job_state(run, JobState("RUNNING", None, False)).state is RunState.STOPPED
    assert record_job_state(run, JobState("CANCELLED", 0, True)).state is RunState.STOPPED
    assert run.record.state is RunState.STOPPED


def test_a_refused_submission_is_a_failure_of_its_own_kind():
    from fsdpctl.rundir.state import Failure

    refused = Failure(kind="refused", host=None, node_rank=None, exit_code=1,
                      detail="sbatch refused the job: Invalid feature specification")
    again = Failure.from_json(json.loads(json.dumps(refused.to_json())))
    assert again == refused
    assert again.describe() == again.headline() == "sbatch refused the job: Invalid feature specification"
