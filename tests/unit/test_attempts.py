"""A run's attempts: the next attempt's plan, keeping the last one apart, resume refusals, restart decisions,
metrics that read as one run, and the checkpoint listing the launcher relies on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fsdpctl.api.attempts import plan_next_attempt, plan_restart
from fsdpctl.backends import plan_run, render_scripts
from fsdpctl.backends.ssh import SSHBackend
from fsdpctl.errors import UsageError
from fsdpctl.plan.types import CodePlan, Overrides, overrides_from_json, overrides_to_json
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.rundir.attempts import begin_attempt, check_resumable
from fsdpctl.rundir.rundir import create_run, load_run
from fsdpctl.rundir.state import Failure, NodeState, Outcome, RunState
from fsdpctl.rundir.status import NodeStatus
from fsdpctl.shell import quote_path
from fsdpctl.workload.layout import complete_steps, complete_steps_command, parse_steps

PROFILE = ("name: t\nbackend: ssh\nhosts: [10.9.0.1, 10.9.0.2]\nnproc_per_node: 1\nworkdir: /scratch/t\n"
           "max_restarts: 2\ntrain:\n  preset: tiny\n  steps: 40\n  checkpoint_interval: 10\n")
RUN_ID = "t-20261121-120000-abcd"


def new_run(tmp_path: Path, overrides: Overrides | None = None):
    profile = parse_profile(PROFILE, "t.yaml")
    overrides = overrides or Overrides(train={"batch_size": 4})
    inputs = {"profile_source": "t.yaml", "local_python": "/usr/bin/python3", "home": "/home/me",
              "local_cwd": str(tmp_path), "overrides": overrides_to_json(overrides)}
    plan = plan_run(profile, run_id=RUN_ID, local_run_dir=str(tmp_path / RUN_ID), overrides=overrides,
                    **{k: v for k, v in inputs.items() if k != "overrides"})
    return create_run(plan, profile, render_scripts(plan), PROFILE, inputs)


def test_overrides_survive_json_with_their_code_plan():
    code = CodePlan(source="/home/me/p", files=3, bytes=10, largest=(("a.py", 7),), origin="git",
                    skipped_links=("l",))
    overrides = Overrides(train={"steps": 5}, command=("train.py", "a b"), code=code, secrets=("TOKEN",),
                          requirements=("numpy",), hang_timeout=60, max_restarts=1)
    assert overrides_from_json(json.loads(json.dumps(overrides_to_json(overrides)))) == overrides


def test_the_next_attempt_is_the_same_plan_resuming_in_the_same_directory(tmp_path):
    run = new_run(tmp_path)
    plan, scripts = plan_next_attempt(SSHBackend(run.profile), run, train={"steps": 60})
    assert plan.attempt == 2 and plan.run_dir == run.plan.run_dir == f"/scratch/t/runs/{RUN_ID}"
    assert plan.train == {**run.plan.train, "steps": 60, "resume": True}
    assert plan.env["FSDPCTL_ATTEMPT"] == "2" and run.plan.env["FSDPCTL_ATTEMPT"] == "1"
    assert plan.master_port == run.plan.master_port and plan.max_restarts == 2
    assert "--resume" in scripts["node1.sh"] and "--steps 60" in scripts["node1.sh"]
    assert "export FSDPCTL_ATTEMPT=2" in scripts["node0.sh"]
    changed = ("attempt", "train", "env", "nodes", "entry")  # the attempt, and the workload's --resume and --steps
    unchanged = {k: v for k, v in plan.to_json().items() if k not in changed}
    assert unchanged == {k: v for k, v in run.plan.to_json().items() if k not in changed}


def test_a_profile_or_flag_cannot_set_resume_itself(tmp_path):
    with pytest.raises(UsageError, match="train.resume: set by fsdpctl"):
        new_run(tmp_path, Overrides(train={"resume": True}))


def test_begin_attempt_keeps_the_last_one_apart_and_in_the_history(tmp_path):
    run = new_run(tmp_path)
    (run.paths.logs / "merged.log").write_text("[n1 r0] step=15 loss=1\n")
    (run.root / "hang").mkdir()
    failure = Failure.from_json({"host": "n2", "node_rank": 1, "rank": 1, "exit_code": -9, "state": "failed"})
    nodes = (NodeStatus(node_rank=0, host="n1", address="10.0.0.1", state=NodeState.FAILED, exit_code=1),)
    run.change(state=RunState.FAILED, nodes=nodes, exit_code=137, first_failure=failure, started_at="t0",
               finished_at="t1")
    plan, scripts = plan_next_attempt(SSHBackend(run.profile), run, train={})
    resumed = begin_attempt(run, plan, scripts, 10)
    kept = run.root / "attempts" / "1"
    assert (kept / "logs" / "merged.log").read_text().startswith("[n1 r0] step=15")
    assert (kept / "hang").is_dir() and json.loads((kept / "plan.json").read_text())["attempt"] == 1
    assert "--resume" not in (kept / "scripts" / "node0.sh").read_text()
    assert "--resume" in (run.root / "scripts" / "node0.sh").read_text()
    assert not (run.paths.logs / "merged.log").exists()
    record = json.loads(resumed.paths.run_record.read_text())
    assert record["attempt"] == 2 and record["from_step"] == 10 and record["state"] == "starting"
    assert "first_failure" not in record and "exit_code" not in record and record["nodes"] == []
    assert record["attempts"] == [{"attempt": 1, "state": "failed", "exit_code": 137, "started_at": "t0",
                                   "finished_at": "t1", "ended_by": "rank 1 on n2 exited 137 (SIGKILL)",
                                   "nodes": [{"node_rank": 0, "host": "n1", "address": "10.0.0.1",
                                              "state": "failed", "exit_code": 1}]}]
    assert resumed.record.attempts[0].nodes == nodes  # each attempt keeps the hosts it ran on
    assert load_run(run.root).plan.attempt == 2


def describe(record: dict[str, Any]) -> str:
    failure = Failure.from_json(record)
    assert failure is not None
    return failure.describe()


def test_failures_in_a_few_words():
    assert describe({"host": "n2", "node_rank": 1, "rank": None, "exit_code": 1}) == "node 1 (n2) exited 1"
    assert describe({"host": "n2", "node_rank": 1, "lost": "silent 30 s"}) == "n2 (node 1) was lost"
    assert describe({"hang": "no progress for 20 s"}) == "a hang (no progress for 20 s)"
    # A rank killed by a signal reads the same wherever it is shown: torchrun's -9 is a shell's 137.
    killed = Failure.from_json({"host": "n2", "node_rank": 1, "rank": 1, "local_rank": 0, "exit_code": -9})
    assert killed is not None and killed.exit_code == 137 and killed.signal == 9
    assert killed.describe() == "rank 1 on n2 exited 137 (SIGKILL)"
    assert killed.headline() == "rank 1 (local rank 0) on n2 (node 1) exited 137 (SIGKILL)"
    assert Failure.from_json(killed.to_json()) == killed


def test_resume_refusals_say_why_in_one_line(tmp_path):
    run = new_run(tmp_path)
    with pytest.raises(UsageError, match=rf"run {RUN_ID}: is still running") as live:
        check_resumable(run, RunState.RUNNING, [10], None)
    assert f"fsdpctl stop {RUN_ID}" in live.value.hint
    with pytest.raises(UsageError, match=r"has no complete checkpoint in /scratch/t/runs/.*every 10 steps"):
        check_resumable(run, RunState.FAILED, [], None)
    with pytest.raises(UsageError, match="newest checkpoint is at step 40 of 40: nothing left"):
        check_resumable(run, RunState.SUCCEEDED, [30, 40], None)
    assert check_resumable(run, RunState.SUCCEEDED, [30, 40], 60) == 40
    assert check_resumable(run, RunState.FAILED, [10], None) == 10
    user = new_run(tmp_path / "u", Overrides(command=("train.py",), chdir="."))
    assert check_resumable(user, RunState.FAILED, [], None) is None  # its own files say where it stands


class Backend(SSHBackend):
    """The SSH backend whose nodes answer that these checkpoint steps are complete."""

    def __init__(self, profile, steps: list[int]):
        super().__init__(profile)
        self.steps = steps

    def ask(self, run, command: str) -> str:
        assert "checkpoints/step_" in command
        return "".join(f"{step}\n" for step in self.steps)


FAILED = Outcome(exit_code=137, state=RunState.FAILED, first_failure=Failure(
    kind="exit", host="10.0.0.2", node_rank=1, rank=1, exit_code=137, signal=9))


@pytest.mark.parametrize(("outcome", "record", "steps", "last", "restarts", "said"), [
    (FAILED, {}, [10], 3, True, "rank 1 on 10.0.0.2 exited 137 (SIGKILL)"),
    (FAILED, {}, [], 3, False, "not restarted: the run has no complete checkpoint yet (it would start from step 0)"),
    (FAILED, {}, [10], 1, False, "not restarted: no restart left (--max-restarts 2)"),
    (FAILED, {"stopped_at": "t"}, [10], 3, False, None),
    (Outcome(exit_code=130, state=RunState.INTERRUPTED), {}, [10], 3, False, None),
])
def test_restart_decisions(tmp_path, outcome, record: dict[str, Any], steps, last, restarts, said):
    run = new_run(tmp_path)
    if record:
        run.change(state=RunState.STOPPED, **record)
    attempt, line = plan_restart(Backend(run.profile, steps), run, outcome, last)
    assert line == said
    assert (attempt is not None) == restarts
    if attempt is not None:
        assert attempt.plan.attempt == 2 and attempt.from_step == 10
    kept = json.loads((run.root / "run.json").read_text()).get("restart")
    if said is None:  # the user ended it: nothing to judge
        assert kept is None
    else:  # a rank killed from outside (SIGKILL): restarted where the rest allows
        assert kept["cause"] == "signal" and kept["restarted"] == restarts, kept
        assert kept["why"] == ("a rank killed from outside (rank 1 on 10.0.0.2 exited 137 (SIGKILL))" if restarts
                               else said)


def test_the_node_side_checkpoint_listing_agrees_with_the_launcher_side(tmp_path):
    for step, complete in ((10, True), (20, True), (30, False)):
        folder = tmp_path / "checkpoints" / f"step_{step:07d}"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_text("")
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoints" / ".tmp-step_0000040").mkdir()
    out = subprocess.run(["bash", "-c", complete_steps_command(quote_path(str(tmp_path)))], capture_output=True,
                         text=True, check=True).stdout
    assert parse_steps(out) == complete_steps(tmp_path) == [10, 20]
    empty = subprocess.run(["bash", "-c", complete_steps_command(quote_path(str(tmp_path / "none")))],
                           capture_output=True, text=True)
    assert empty.returncode == 0 and parse_steps(empty.stdout) == []


def test_metrics_of_a_resumed_run_drop_what_the_failed_attempt_wrote_after_the_checkpoint(tmp_path):
    from fsdpctl.workload.metrics import RunLog

    rows = [{"kind": "train", "step": s, "loss": 1.0 / s} for s in range(1, 16)] + [{"kind": "val", "step": 10}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "tr')
    RunLog(tmp_path, rank=0, resumed_step=10)
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in kept if r["kind"] == "train"] == list(range(1, 11))
    assert [r for r in kept if r["kind"] == "val"] == [{"kind": "val", "step": 10}]
    RunLog(tmp_path, rank=1, resumed_step=None)  # not rank 0: touches nothing
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 11
    RunLog(tmp_path, rank=0, resumed_step=None)  # a fresh run starts the file afresh
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_two_resumes_of_one_run_at_once_cannot_both_start(tmp_path):
    """The lock is taken before the next attempt is planned and held until it has started: a second
    resume meanwhile is refused in one line (after that, the run is live and refused for that)."""
    from fsdpctl.rundir.rundir import attempt_lock

    run = new_run(tmp_path)
    with attempt_lock(run):
        refused = f"run {RUN_ID}: another fsdpctl is starting its next attempt now"
        with pytest.raises(UsageError, match=refused), attempt_lock(load_run(run.root)):
            pass
        probe = subprocess.run([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); "
                                "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", str(run.root / ".attempt.lock")],
                               capture_output=True, text=True)
        assert probe.returncode != 0 and "BlockingIOError" in probe.stderr  # another process is refused too
    with attempt_lock(run):  # released once the first is done
        pass
