"""The Python API's contract without a cluster: its names, errors as exceptions of the hierarchy
(never SystemExit), a dry plan, the state and failure types, and a run read back from its directory."""

from __future__ import annotations

import json

import pytest

import fsdpctl
from fsdpctl import api
from fsdpctl.rundir.state import Failure, Outcome, RunState
from tests.conftest import REPO


def test_the_public_names_are_the_apis_and_all_resolve():
    assert list(fsdpctl.PUBLIC_NAMES) == api.__all__
    for name in fsdpctl.PUBLIC_NAMES:
        assert getattr(fsdpctl, name) is getattr(api, name), name
    with pytest.raises(AttributeError):
        fsdpctl.no_such_name  # noqa: B018


@pytest.mark.parametrize(("call", "error", "words"), [
    (lambda: fsdpctl.load_profile("no-such-profile"), fsdpctl.ProfileNotFound, "no such profile"),
    (lambda: fsdpctl.launch("local", steps="many"), fsdpctl.UsageError, "--steps"),
    (lambda: fsdpctl.launch("local", learning_rat=1e-3), fsdpctl.UsageError, "--learning-rat: unknown setting"),
    (lambda: fsdpctl.launch("local", hang_timeout=3), fsdpctl.UsageError, "--hang-timeout 3: too short"),
    (lambda: fsdpctl.launch("local", detach=True, fetch=["outputs"]), fsdpctl.UsageError, "--fetch"),
    (lambda: fsdpctl.launch("local", ["train.py"], steps=3), fsdpctl.UsageError, "a setting of the bundled workload"),
    (lambda: fsdpctl.launch("local", nodes=2), fsdpctl.UsageError, "settings of a scheduler, and local takes none"),
    (lambda: fsdpctl.launch("local", options=fsdpctl.JobOptions(), steps=3), fsdpctl.UsageError, "both given"),
    (lambda: fsdpctl.submit("local", max_restarts=2), fsdpctl.UsageError, "requeue"),
    (lambda: fsdpctl.get_run("local-20260101-000000-beef"), fsdpctl.UsageError, "not found"),
])
def test_api_errors_are_exceptions_with_a_hint_never_an_exit(call, error, words, tmp_path, monkeypatch,
                                                             isolated_home):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FSDPCTL_RUNS_DIR", str(tmp_path / "runs"))
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, fsdpctl.FsdpctlError) and raised.value.hint
    assert words in raised.value.message
    assert not (tmp_path / "runs").exists(), "nothing was started or written"


def test_prepare_plans_without_touching_anything(tmp_path, monkeypatch, isolated_home):
    monkeypatch.chdir(REPO)
    prepared = fsdpctl.prepare("local", steps=7, lr=3e-3, runs_dir=tmp_path / "runs")
    assert prepared.plan.train["steps"] == 7 and prepared.plan.train["lr"] == 3e-3
    assert prepared.plan.local_run_dir.startswith(str(tmp_path / "runs"))
    assert "node0.sh" in prepared.scripts and "--steps 7" in prepared.scripts["node0.sh"]
    assert not (tmp_path / "runs").exists()
    user = fsdpctl.prepare("local", "train.py --lr 3e-4", code=REPO / "examples" / "fsdp2_minimal",
                           env=["A=1", "SECRET_NAME"], runs_dir=tmp_path / "runs")
    assert user.plan.command == ("train.py", "--lr", "3e-4") and user.plan.secrets == ("SECRET_NAME",)
    assert user.plan.env["A"] == "1"


def test_states_know_when_a_run_is_over_and_whether_it_failed():
    assert RunState.parse("timeout") is RunState.TIMEOUT and RunState.parse("NODE_FAIL") is RunState.NODE_FAIL
    assert RunState.parse("who knows") is RunState.UNKNOWN
    for state in (RunState.TIMEOUT, RunState.NODE_FAIL, RunState.OUT_OF_MEMORY, RunState.FAILED,
                  RunState.CANCELLED, RunState.PREEMPTED):
        assert state.is_over and state.is_failure, state
    for state in (RunState.SUCCEEDED, RunState.STOPPED, RunState.INTERRUPTED):
        assert state.is_over and not state.is_failure, state
    for state in (RunState.STARTING, RunState.SUBMITTED, RunState.RUNNING):
        assert not state.is_over, state
    assert json.dumps({"state": RunState.RUNNING}) == '{"state": "running"}'


def test_a_run_that_ended_is_read_back_without_its_nodes(tmp_path, monkeypatch, isolated_home):
    """``get_run(...).wait()`` on an ended run answers from run.json (no node is asked)."""
    monkeypatch.chdir(REPO)
    prepared = fsdpctl.prepare("two-node", steps=5, runs_dir=tmp_path / "runs")
    from fsdpctl.rundir.rundir import create_run

    run_dir = create_run(prepared.plan, prepared.loaded.profile, prepared.scripts, prepared.loaded.text)
    failure = Failure(kind="exit", host="node2", node_rank=1, rank=1, local_rank=0, exit_code=137, signal=9)
    run_dir.change(state=RunState.FAILED, exit_code=137, first_failure=failure)
    run = fsdpctl.get_run(prepared.plan.run_id, runs_dir=tmp_path / "runs")
    assert run.info.state is RunState.FAILED and run.info.backend == "ssh"
    outcome = run.wait(timeout=0.1)
    assert outcome == Outcome(exit_code=137, state=RunState.FAILED, first_failure=failure)
    assert [r.run_id for r in fsdpctl.runs(runs_dir=tmp_path / "runs")] == [run.run_id]
    with pytest.raises(fsdpctl.UsageError, match="no rank is running"):
        run.stacks()
    assert issubclass(fsdpctl.WaitTimeout, TimeoutError) and issubclass(fsdpctl.WaitTimeout, fsdpctl.FsdpctlError)
