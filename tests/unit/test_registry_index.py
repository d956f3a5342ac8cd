"""The registry index (``<runs dir>/.index.json``) against the run directories it is made from: the
same rows with and without it, after it is deleted or corrupt, after a run changes or is deleted,
and ``fsdpctl runs --json`` reading it without loading what it does not need."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpctl.rundir.index import INDEX_NAME, RegistryIndex, make_row
from fsdpctl.rundir.rundir import load_run
from fsdpctl.rundir.state import RunState
from tests.conftest import REPO, run_cli

PROFILE = ("name: idx\nbackend: ssh\nhosts: [10.9.0.1, 10.9.0.2]\nnproc_per_node: 2\n"
           "train:\n  preset: tiny\n  steps: 50\n")
RUNS = 4
LONG_AGO = 1_700_000_000


def make_run(runs: Path, index: int, state: RunState):
    from fsdpctl.backends import plan_run, render_scripts
    from fsdpctl.plan.types import Overrides
    from fsdpctl.profiles.loader import parse_profile
    from fsdpctl.rundir.rundir import create_run

    profile = parse_profile(PROFILE, "idx.yaml")
    run_id = f"idx-20260101-0000{index:02d}-{index:04x}"
    plan = plan_run(profile, run_id=run_id, local_run_dir=str(runs / run_id), overrides=Overrides(),
                    profile_source="idx.yaml", local_python="/usr/bin/python3", home="/home/me", local_cwd=str(runs))
    run = create_run(plan, profile, render_scripts(plan), PROFILE)
    ended = {"finished_at": "2026-01-01T01:00:00+00:00", "exit_code": 0} if state.is_over else {}
    run.change(state=state, started_at="2026-01-01T00:00:00+00:00", **ended)
    return run


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Runs made once: three ended, the newest running."""
    runs = tmp_path_factory.mktemp("template") / "runs"
    for i in range(RUNS):
        make_run(runs, i, RunState.RUNNING if i == RUNS - 1 else RunState.SUCCEEDED)
    return runs


@pytest.fixture
def runs(template, tmp_path) -> Path:
    """The template's runs, this test's own, their files as if written long ago (settled)."""
    copy = tmp_path / "runs"
    shutil.copytree(template, copy)
    settle(copy)
    return copy


def settle(runs: Path) -> None:
    for path in [*runs.rglob("*"), runs]:
        os.utime(path, (LONG_AGO, LONG_AGO), follow_symlinks=False)


def raw_rows(runs: Path) -> list[dict]:
    """Every run's row made from its files, in ``list_runs``'s order: what the index must agree with."""
    from fsdpctl.rundir.paths import list_runs

    return [make_row(path)[0] for path in list_runs(runs)]


def indexed(runs: Path) -> list[dict]:
    """The rows a fresh reader gets (it reads the index file, as another process would)."""
    return [dict(item.row) for item in RegistryIndex(runs).runs()]


def test_the_index_lists_what_the_files_say_and_is_private(runs):
    assert not (runs / INDEX_NAME).exists()
    first = indexed(runs)  # made from the files, then written
    assert first == raw_rows(runs) and len(first) == RUNS
    assert [r["state"] for r in first] == ["succeeded"] * (RUNS - 1) + ["running"]
    saved = runs / INDEX_NAME
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert indexed(runs) == first  # read back from the index
    saved.unlink()
    assert indexed(runs) == first and saved.exists()  # rebuilt when missing


def test_a_settled_row_is_read_from_the_index_until_its_run_changes(runs):
    rows = indexed(runs)
    data = json.loads((runs / INDEX_NAME).read_text())
    oldest = rows[0]["run_id"]
    data["runs"][oldest]["row"]["profile"] = "from-the-index"  # only the index says this
    (runs / INDEX_NAME).write_text(json.dumps(data))
    assert indexed(runs)[0]["profile"] == "from-the-index"  # nothing of the run was read again
    load_run(runs / oldest).change(state=RunState.FAILED, exit_code=3)  # its state changes, a moment later
    again = indexed(runs)
    assert again[0]["profile"] == "idx" and (again[0]["state"], again[0]["exit_code"]) == ("failed", 3)
    assert again == raw_rows(runs)


def test_a_change_right_after_a_listing_is_seen_by_the_next(runs):
    index = RegistryIndex(runs)
    newest = load_run(runs / index.runs()[-1].row["run_id"])
    for state in (RunState.FAILED, RunState.STOPPED, RunState.SUCCEEDED):  # within the same clock tick, likely
        newest.change(state=state)
        assert index.runs()[-1].row["state"] == str(state) == indexed(runs)[-1]["state"]


def test_a_deleted_run_is_dropped_and_a_new_one_listed(runs):
    rows = indexed(runs)
    shutil.rmtree(runs / rows[1]["run_id"])
    make_run(runs, 40, RunState.SUCCEEDED)
    after = indexed(runs)
    assert [r["run_id"] for r in after] == [rows[0]["run_id"], *(r["run_id"] for r in rows[2:]),
                                           "idx-20260101-000040-0028"]
    assert after == raw_rows(runs)
    assert sorted(json.loads((runs / INDEX_NAME).read_text())["runs"]) == sorted(r["run_id"] for r in after)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 1, "runs": []}', '{"version": 99, "runs": {}}',
                                  '{"version": 1, "runs": {"idx-20260101-000000-0000": {"row": 1}}}',
                                  '{"version": 1, "runs": {"idx-20260101-000001-0001": {"row": {}, "watched": [], '
                                  '"stamps": [], "settled": true}}}'])
def test_a_corrupt_index_is_rebuilt(runs, text):
    expected = raw_rows(runs)
    (runs / INDEX_NAME).write_text(text)
    assert indexed(runs) == expected
    assert json.loads((runs / INDEX_NAME).read_text())["version"] == 1


def test_an_index_a_slower_process_wrote_back_costs_a_read_not_a_row(runs):
    indexed(runs)
    stale = (runs / INDEX_NAME).read_text()  # what a second process read before the change
    oldest = indexed(runs)[0]["run_id"]
    load_run(runs / oldest).change(state=RunState.FAILED, exit_code=1)
    assert indexed(runs)[0]["state"] == "failed"
    (runs / INDEX_NAME).write_text(stale)  # that process saves after this one: the change is lost from the file
    assert indexed(runs)[0]["state"] == "failed"


def test_new_metrics_copies_are_read(runs):
    rows = indexed(runs)
    root = runs / rows[-1]["run_id"]
    assert rows[-1]["step"] is None
    copy = root / "live" / "node0" / "metrics.jsonl"
    copy.parent.mkdir(parents=True)
    copy.write_text(json.dumps({"kind": "train", "step": 7, "loss": 2.5, "tokens_per_s": 900.0}) + "\n")
    assert (indexed(runs)[-1]["step"], indexed(runs)[-1]["loss"]) == (7, 2.5)
    with copy.open("a") as out:
        out.write(json.dumps({"kind": "train", "step": 8, "loss": 2.25}) + "\n")
    assert indexed(runs)[-1]["step"] == 8 == raw_rows(runs)[-1]["step"]


def test_the_api_and_the_dashboard_list_the_same_runs_as_the_files(runs):
    import fsdpctl
    from fsdpctl.web.data import RunsIndex, run_row

    listed = fsdpctl.runs(runs_dir=runs)
    assert [run.info for run in listed] == [fsdpctl.Run(load_run(run.path)).info for run in listed]
    assert listed[0].plan.run_id == listed[0].run_id  # the directory is read when asked for
    page = RunsIndex(runs).listing()
    assert [r["run_id"] for r in page] == [run.run_id for run in reversed(listed)]
    for row in page:
        made = run_row(runs / row["run_id"])
        assert {**row, "duration_s": None} == {**made, "duration_s": None}
    assert page[-1]["duration_s"] == 3600.0 and page[-1]["nodes"] == 2


def settled(stdout: str) -> list[dict]:
    """``runs --json``'s rows, a live run's duration (to now) aside."""
    return [{**r, "duration_s": r["duration_s"] if r["ended_at"] else None} for r in json.loads(stdout)]


def test_runs_json_is_the_same_with_and_without_the_index_and_loads_no_profile(runs):
    env = {"FSDPCTL_RUNS_DIR": str(runs)}
    without = run_cli("runs", "--json", env=env)
    assert without.returncode == 0, without.stderr
    assert (runs / INDEX_NAME).exists()
    with_index = run_cli("runs", "--json", env=env)
    assert settled(with_index.stdout) == settled(without.stdout)
    assert [r["state"] for r in json.loads(with_index.stdout)] == ["succeeded"] * (RUNS - 1) + ["running"]
    newest = json.loads(with_index.stdout)[-1]["run_id"]
    load_run(runs / newest).change(state=RunState.SUCCEEDED)  # no live run: no backend to ask
    shown = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom fsdpctl.cli.app import main\ntry:\n    main(['runs', '--json'])\n"
         "except SystemExit:\n    pass\nprint(sorted(m for m in sys.modules if m.startswith(('fsdpctl', 'yaml'))))"],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    loaded = set(json.loads(shown.stdout.splitlines()[-1].replace("'", '"')))
    assert not loaded & {"yaml", "fsdpctl.profiles.loader", "fsdpctl.plan.types", "fsdpctl.rundir.rundir",
                         "fsdpctl.api.estimate", "fsdpctl.api.doctor", "fsdpctl.live.snapshot", "fsdpctl.backends"}
