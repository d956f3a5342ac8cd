"""Slurm specifics that need no cluster: requeue in the plan, submitit's parameters, the shipped
submitit, time limits, and the sbatch options a profile may not set."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fsdpctl.backends import plan_run
from fsdpctl.backends.slurm.plan import SlurmPlan, time_limit_minutes
from fsdpctl.backends.slurm.via_submitit import ship_submitit, submitit_parameters
from fsdpctl.errors import UsageError
from fsdpctl.plan.types import Overrides
from fsdpctl.profiles.loader import load_profile, parse_profile
from fsdpctl.rundir.state import RunState

RUN_ID = "slurm-20261121-120000-abcd"


def slurm_plan(train=None, **options):
    """The plan of a Slurm run and its Slurm part (``options``: submit's settings)."""
    plan = plan_run(load_profile("slurm").profile, run_id=RUN_ID, local_run_dir="r", home="/home/me",
                    backend="slurm", overrides=Overrides(train=train or {}, backend_options=options))
    return plan, SlurmPlan.of(plan)


def test_every_slurm_run_resumes_if_requeued_and_requeue_adds_signal_and_checkpointing():
    plain, plain_slurm = slurm_plan()
    assert plain.train["resume_if_present"] is True and "checkpoint_on_signal" not in plain.train
    assert "requeue" not in dict(plain_slurm.directives) and "trap" not in plain_slurm.step_command
    requeued, requeued_slurm = slurm_plan(requeue=True)
    directives = dict(requeued_slurm.directives)
    assert directives["requeue"] == "" and directives["signal"] == "USR2@120" and directives["open-mode"] == "append"
    assert requeued.train["checkpoint_on_signal"] is True
    assert "--checkpoint-on-signal" in requeued_slurm.step_command
    assert "trap '' USR2 && " in requeued_slurm.step_command  # torchrun must outlive the warning


def test_requeue_without_checkpoints_is_refused():
    with pytest.raises(UsageError, match="requeue: a requeued job resumes from a checkpoint"):
        slurm_plan(requeue=True, train={"no_checkpoint": True})


def test_submitit_runs_ignore_usr2_in_torchrun_even_without_requeue():
    assert "trap '' USR2" in slurm_plan(via="submitit")[1].step_command


@pytest.mark.parametrize("text,minutes", [("10", 10), ("1:30", 2), ("02:00:00", 120), ("1-00", 1440),
                                          ("1-2:30", 1590), ("1-0:0:1", 1441), ("UNLIMITED", None)])
def test_time_limits_in_minutes(text, minutes):
    assert time_limit_minutes(text) == minutes


def test_submitit_parameters_from_the_directives():
    _, slurm = slurm_plan(requeue=True)
    params = submitit_parameters(slurm.directives, ["echo setup"], slurm.signal_seconds)
    assert params["nodes"] == 2 and params["ntasks_per_node"] == 1 and params["gpus_per_node"] == 8
    assert params["time"] == 120 and params["partition"] == "gpu" and params["signal_delay_s"] == 120
    assert params["additional_parameters"] == {"requeue": True, "exclusive": True}
    assert params["srun_args"] == ["--kill-on-bad-exit=1"] and params["setup"] == ["echo setup"]
    assert "output" not in params and "signal" not in params  # submitit writes its own


def test_shipped_submitit_imports_without_site_packages(tmp_path):
    ship_submitit(str(tmp_path))
    # -S: no site-packages, so only the shipped copies (and the standard library) can be imported.
    probe = ("import submitit, cloudpickle, submitit.core._submit, submitit.helpers; "
             "print(submitit.__file__)")
    done = subprocess.run([sys.executable, "-S", "-c", probe], env={"PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(tmp_path))


@pytest.mark.parametrize("directive,fix", [("--signal=USR1@60", "use slurm.requeue: true and slurm.signal_seconds"),
                                           ("--requeue", "use slurm.requeue: true (or --requeue)"),
                                           ("--output=x", "remove it")])
def test_directives_fsdpctl_writes_are_refused_at_submit(directive, fix):
    text = f"name: s\nbackend: slurm\nslurm:\n  nodes: 2\n  directives: ['{directive}']\n"
    profile = parse_profile(text, "s.yaml")  # loads: runs recorded with such a profile stay readable
    with pytest.raises(UsageError, match="s.yaml: slurm.directives\\[0\\]: .* is written by fsdpctl") as caught:
        plan_run(profile, run_id="s-20261121-120000-abcd", local_run_dir="r", backend="slurm",
                 profile_source="s.yaml")
    assert caught.value.hint == fix


def test_time_limits_that_requeue_or_submitit_cannot_work_with_are_refused():
    untimed = parse_profile("name: s\nbackend: slurm\nslurm:\n  nodes: 2\n", "s.yaml")
    with pytest.raises(UsageError, match="slurm.time: --via submitit needs a time limit"):
        plan_run(untimed, run_id=RUN_ID, local_run_dir="r", backend="slurm",
                 overrides=Overrides(backend_options={"via": "submitit"}))
    with pytest.raises(UsageError, match="slurm.signal_seconds: SIGUSR2 120 s before a 3 time limit"):
        slurm_plan(requeue=True, time="3")
    assert slurm_plan(requeue=True, time="4")[1].requeue  # 240 s: twice the warning


def test_srun_label_pieces_of_a_long_probe_line_are_joined_back():
    from fsdpctl.backends.slurm.tasks import split_tasks
    from fsdpctl.hostcheck.probe import parse_probe_output
    from fsdpctl.hostcheck.probe_script import BEGIN, END

    answer = '{"hostname": "n2", "ok": true, "note": "a\\\\nb"}'
    out = f"1: welcome\n0: \n0: {BEGIN}\n0: {answer[:20]}\n1: {BEGIN}\n0: {answer[20:]}\n1: {{\"hostname\": \"n1\"}}\n"
    out += f"0: {END}\n1: {END}\n"
    tasks = split_tasks(out, BEGIN, END)
    assert parse_probe_output(tasks[0]) == {"hostname": "n2", "ok": True, "note": "a\\nb"}
    assert parse_probe_output(tasks[1]) == {"hostname": "n1"} and tasks[1].startswith("welcome")


def test_srun_pieces_that_cut_through_a_sentinel_are_joined_back():
    from fsdpctl.backends.slurm.tasks import split_tasks
    from fsdpctl.node.stacks import BEGIN, END, answer_of

    line = BEGIN + json.dumps({"host": "n2", "ranks": [{"rank": 1, "frames": ["x" * 30]}]}) + END
    pieces = [line[i:i + 17] for i in range(0, len(line), 17)]  # cuts BEGIN, the JSON and END alike
    out = "".join(f"1: {piece}\n" for piece in pieces) + "0: " + BEGIN + '{"host": "n1"}' + END + "\n"
    tasks = split_tasks(out, BEGIN, END)
    assert answer_of(tasks[1]) == {"host": "n2", "ranks": [{"rank": 1, "frames": ["x" * 30]}]}
    assert answer_of(tasks[0]) == {"host": "n1"}


def test_a_node_that_does_not_see_the_workdir_is_warned_about():
    from fsdpctl.backends.slurm.doctor import storage_check

    assert storage_check({"shared_file": True}, "/shared/w").status == "pass"
    check = storage_check({"shared_file": False}, "/local/w")
    assert check.status == "warn" and "/local/w" in check.detail and "shares" in check.hint


def test_doctors_allocation_lasts_as_long_as_its_probe_may():
    """5 minutes, or longer when the probe may take longer (an image pulled on every node: 900 s)."""
    from fsdpctl.backends.slurm.doctor import srun_argv

    profile = parse_profile("name: s\nbackend: slurm\nslurm:\n  nodes: 2\n", "s.yaml")
    assert "--time=5" in srun_argv(profile, 2, None, 20, "true")
    assert "--time=16" in srun_argv(profile, 2, None, 900, "true")


def test_sacct_lines_give_the_final_state_once_the_controller_forgot_the_job():
    from fsdpctl.backends.slurm.client import JobState, parse_sacct

    assert parse_sacct("COMPLETED|0:0\n") == JobState("COMPLETED", 0, True)
    assert parse_sacct("CANCELLED by 0|0:15\n") == JobState("CANCELLED", 143, True)
    assert parse_sacct("FAILED|2:0\n") == JobState("FAILED", 2, True)
    assert parse_sacct("RUNNING|0:0\n").finished is False
    assert parse_sacct("") is None


def test_slurms_job_states_as_run_states():
    from fsdpctl.backends.slurm import states

    assert states.run_state("COMPLETED", 0) is RunState.SUCCEEDED
    assert states.run_state("COMPLETED", 1) is RunState.FAILED
    assert states.run_state("PENDING", None) is RunState.SUBMITTED
    assert states.live_state("COMPLETING") is RunState.RUNNING and states.live_state("REQUEUED") is RunState.SUBMITTED


def test_a_slurm_job_that_failed_on_slurms_side_never_exits_0():
    """TIMEOUT or NODE_FAIL with Slurm's ExitCode 0:0 is a failure: a script testing $? must see it."""
    from fsdpctl.backends.slurm.states import ending

    assert ending("COMPLETED", 0) == (RunState.SUCCEEDED, 0)
    assert ending("COMPLETED", None) == (RunState.SUCCEEDED, 0)
    assert ending("FAILED", 3) == (RunState.FAILED, 3)
    assert ending("TIMEOUT", 0) == (RunState.TIMEOUT, 1)
    assert ending("NODE_FAIL", None) == (RunState.NODE_FAIL, 1)
    assert ending("CANCELLED", 0) == (RunState.CANCELLED, 1)
