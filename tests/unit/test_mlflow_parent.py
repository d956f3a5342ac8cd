"""A run's MLflow parent run, against MLflow's own local file store: made once per fsdpctl run and
found again by a later attempt, its status set at the end, its id in every rank's environment and in
the inputs every later attempt is planned from; nothing made by a dry plan; a missing mlflow and a
server that does not answer said in one line (and, once the run exists, as a notice only)."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import fsdpctl
from fsdpctl.api.events import Emitter, Notice
from fsdpctl.errors import FsdpctlError, UsageError
from fsdpctl.export.mlflow_parent import parent_run, set_status
from fsdpctl.plan.export import PARENT_RUN_ENV
from fsdpctl.rundir.state import RunState

PROFILE = """name: tracked
backend: local
device: cpu
nproc_per_node: 1
workdir: {workdir}
export:
  mlflow:
    tracking_uri: {uri}
    experiment: t
"""


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    """A file store MLflow writes under the test's folder (MLflow 3 refuses one unless told it may)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return f"file://{tmp_path}/mlruns"


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_a_run_gets_one_parent_found_again_by_a_later_attempt_and_its_status_set_at_the_end(store):
    first = parent_run(tracking_uri=store, experiment="t", run_id="p-1", profile="lab", backend="ssh")
    parent = client(store).get_run(first)
    assert parent.info.status == "RUNNING" and parent.info.run_name == "p-1"
    assert {k: v for k, v in parent.data.tags.items() if k.startswith("fsdpctl.")} == {
        "fsdpctl.run_id": "p-1", "fsdpctl.profile": "lab", "fsdpctl.backend": "ssh"}
    assert client(store).get_experiment(parent.info.experiment_id).name == "t"  # made when missing

    set_status(store, first, "FAILED")  # an attempt failed...
    assert client(store).get_run(first).info.status == "FAILED"
    again = parent_run(tracking_uri=store, experiment="t", run_id="p-1", profile="lab", backend="ssh")
    assert again == first and client(store).get_run(first).info.status == "RUNNING"  # ...and the next one runs
    other = parent_run(tracking_uri=store, experiment="t", run_id="p-2", profile="lab", backend="ssh")
    assert other != first

    set_status(store, first, "FINISHED")
    ended = client(store).get_run(first).info
    assert ended.status == "FINISHED" and ended.end_time
    runs = client(store).search_runs([parent.info.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["p-1", "p-2"]


def test_without_mlflow_here_the_launch_stops_in_one_line_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # an import of it now fails, as where it is not installed
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(UsageError) as raised:
        parent_run(tracking_uri="http://mlflow:5000", experiment="t", run_id="p-1", profile="lab", backend="ssh")
    assert "mlflow is not installed here" in raised.value.message and "\n" not in raised.value.message
    assert "pip install mlflow-skinny" in raised.value.hint


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_that_does_not_answer_stops_a_launch_but_only_costs_a_finished_run_a_notice(monkeypatch):
    pytest.importorskip("mlflow")
    nobody = f"http://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    with pytest.raises(FsdpctlError) as raised:  # MLflow's client would retry for minutes
        parent_run(tracking_uri=nobody, experiment="t", run_id="p-1", profile="lab", backend="ssh", timeout=2)
    assert time.monotonic() - started < 10
    assert "no answer in 2 s" in raised.value.message and nobody in raised.value.hint

    from fsdpctl.api.parent_run import end_status, mark_parent

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # refused at once rather than after the retries
    heard: list = []
    plan = SimpleNamespace(export={"mlflow": {"tracking_uri": nobody, "experiment": "t"}},
                           env={PARENT_RUN_ENV: "0123456789abcdef0123456789abcdef"})
    mark_parent(plan, end_status(RunState.SUCCEEDED), Emitter(heard.append))  # raises nothing
    (notice,) = heard
    assert isinstance(notice, Notice) and notice.level == "warning"
    assert "could not set parent run" in notice.text and "the run is not affected" in notice.text


def test_how_a_run_ended_is_mlflows_word_for_it():
    from fsdpctl.api.parent_run import end_status

    assert end_status(RunState.SUCCEEDED) == "FINISHED"
    assert end_status(RunState.STOPPED) == end_status(RunState.INTERRUPTED) == "KILLED"
    assert end_status(RunState.FAILED) == end_status(RunState.TIMEOUT) == end_status(RunState.NODE_FAIL) == "FAILED"
    assert end_status(RunState.UNKNOWN) is None and end_status(RunState.RUNNING) is None


def test_the_parent_id_reaches_every_rank_and_every_later_attempt_and_a_dry_plan_makes_none(
        store, tmp_path, monkeypatch, isolated_home):
    from fsdpctl.api.attempts import plan_next_attempt
    from fsdpctl.api.parent_run import with_parent_run
    from fsdpctl.backends import backend_for
    from fsdpctl.rundir.rundir import create_run

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tracked.yaml"
    path.write_text(PROFILE.format(workdir=tmp_path, uri=store))
    prepared = fsdpctl.prepare(path, steps=4, runs_dir=tmp_path / "runs")
    assert PARENT_RUN_ENV not in prepared.plan.env
    assert not Path(store.removeprefix("file://")).exists(), "a dry plan makes no parent run"

    heard: list = []
    started = with_parent_run(prepared, Emitter(heard.append))
    parent = started.plan.env[PARENT_RUN_ENV]
    assert client(store).get_run(parent).data.tags["fsdpctl.run_id"] == prepared.plan.run_id
    assert f"mlflow: parent run {parent}" in heard[0].text
    assert f"{PARENT_RUN_ENV}={parent}" in started.scripts["node0.sh"]
    assert started.inputs["overrides"]["extra_env"] == {PARENT_RUN_ENV: parent}
    same = {k: v for k, v in started.plan.to_json().items() if k != "env"}
    assert same == {k: v for k, v in prepared.plan.to_json().items() if k != "env"}  # the same run, one more variable

    run = create_run(started.plan, started.loaded.profile, started.scripts, started.loaded.text, started.inputs)
    later, scripts = plan_next_attempt(backend_for(run.profile, run.plan.backend), run, train={})
    assert later.attempt == 2 and later.env[PARENT_RUN_ENV] == parent
    assert f"{PARENT_RUN_ENV}={parent}" in scripts["node0.sh"]


def test_a_launch_that_never_starts_leaves_its_parent_failed(store, tmp_path, monkeypatch, isolated_home):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FSDPCTL_TEST_UNSET_SECRET", raising=False)
    path = tmp_path / "tracked.yaml"
    path.write_text(PROFILE.format(workdir=tmp_path, uri=store))
    with pytest.raises(UsageError, match="FSDPCTL_TEST_UNSET_SECRET"):  # read when the payload is made
        fsdpctl.launch(path, secrets=["FSDPCTL_TEST_UNSET_SECRET"], steps=4, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists(), "nothing started"
    (parent,) = client(store).search_runs([client(store).get_experiment_by_name("t").experiment_id])
    assert parent.info.status == "FAILED" and parent.data.tags["fsdpctl.run_id"].startswith("tracked-")
