"""When a multi-node job hangs or crashes, on the namespace testbed: `fsdpctl stacks` over 2 nodes x 2
ranks (with py-spy on the nodes, and with a node Python that has none), the hang watchdog ending the
run with its stacks and flight-recorder dumps kept, and a segfaulting rank's Python stack."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.integration.api_driver import api
from tests.integration.test_launch import processes_of, run, run_dir_of, start, wait_for_line
from tests.integration.user_project import write_project

pytestmark = pytest.mark.integration

HANG_TIMEOUT = 20


def python_without_py_spy(root: Path) -> str:
    """This venv seen through another folder whose bin/ holds only python: a node with torch and
    everything the job needs, but no py-spy (not beside its Python, not on the PATH of its shell)."""
    venv = Path(sys.prefix)
    view = root / "venv-without-py-spy"
    (view / "bin").mkdir(parents=True)
    (view / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    shutil.copy(venv / "pyvenv.cfg", view / "pyvenv.cfg")
    (view / "lib").symlink_to(venv / "lib", target_is_directory=True)
    return str(view / "bin" / "python")


def hang_profile(lab, tmp_path: Path, python: str) -> Path:
    path = tmp_path / "hang.yaml"
    path.write_text(lab.profile_yaml(["n1", "n2"], python=python, name="hang"))
    return path


@pytest.mark.parametrize("node_python", ["with py-spy", "without py-spy"])
def test_stacks_fold_the_waiting_ranks_and_the_watchdog_ends_a_hung_run(lab, tmp_path, node_python):
    if node_python == "with py-spy" and shutil.which("py-spy", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("py-spy is not installed next to this Python (pip install -e .[test] installs it)")
    python = sys.executable if node_python == "with py-spy" else python_without_py_spy(tmp_path)
    project = write_project(tmp_path / "project")
    launcher = start(lab, tmp_path, "launch", "-p", str(hang_profile(lab, tmp_path, python)), "--nproc-per-node",
                     "2", "--hang-timeout", str(HANG_TIMEOUT), "--code", str(project), "--env", "STEPS=1000",
                     "--env", "HANG_RANK=3", "--env", "STEP_SLEEP=0.2", "--", "train.py")
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"user step=2 ")
    stalled_at = time.monotonic()  # rank 3 waits after step 2; the others wait in step 3's collectives
    time.sleep(2)
    addresses = [lab.hosts["n1"].address, lab.hosts["n2"].address]

    shown = run(lab, tmp_path, "stacks", run_dir.name)
    assert shown.returncode == 0, shown.stderr[-2000:]
    print(f"\n--- fsdpctl stacks ({node_python}) ---\n{shown.stdout}")
    method = "py-spy" if node_python == "with py-spy" else "faulthandler"
    assert f"4 rank(s) on 2 node(s) ({addresses[0]}: {method}, {addresses[1]}: {method})" in shown.stdout
    blocks = shown.stdout.split("\n\n")[1:]
    assert blocks[0].startswith(f"rank 3 on {addresses[1]}  (1 of 4) - the odd one out"), shown.stdout
    assert re.search(r"at proj/train\.py:\d+ in wait_for_a_lock_that_never_frees", blocks[0]) or \
        re.search(r"at train\.py:\d+ in wait_for_a_lock_that_never_frees", blocks[0]), blocks[0]
    assert blocks[1].startswith(f"ranks 0-2 on {addresses[0]},{addresses[1]}  (3 of 4)"), shown.stdout
    assert "wait_for_a_lock" not in blocks[1]
    as_json = json.loads(run(lab, tmp_path, "stacks", run_dir.name, "--json").stdout)
    assert sorted(r["rank"] for node in as_json for r in node["ranks"]) == [0, 1, 2, 3]
    reported, done = api(lab, tmp_path, f"""
        found = fsdpctl.get_run({run_dir.name!r}).stacks()
        odd = found.odd_one_out()
        report({{"groups": [g.ranks for g in found.groups], "odd": odd.ranks if odd else None,
                "where": odd.headline() if odd else None, "answered": found.answered}})
    """)
    assert done.returncode == 0 and reported, done.stderr[-2000:]
    assert reported[0]["groups"] == [[3], [0, 1, 2]] and reported[0]["odd"] == [3] and reported[0]["answered"]
    assert "wait_for_a_lock_that_never_frees" in reported[0]["where"]

    code, out, err = launcher.finish(timeout=HANG_TIMEOUT + 60)
    fired_after = time.monotonic() - stalled_at
    print(f"--- the launcher ({node_python}): exit {code}, {fired_after:.1f} s after the stall ---\n{err[-4000:]}")
    assert code == 124, err[-3000:]
    assert re.search(rf"no progress for \d+ s \(hang timeout {HANG_TIMEOUT} s\)", err)
    assert f"rank 3 on {addresses[1]} stands apart, at" in err and "wait_for_a_lock_that_never_frees" in err
    assert "Traceback" not in err.split("fsdpctl: no progress")[1].split("fsdpctl: run ")[0]
    hang = run_dir / "hang"
    assert {p.name for p in hang.iterdir()} >= {"stacks.json", "stacks.txt", "flight"}
    assert sorted(p.name for p in (hang / "flight" / "cpu").glob("rank_*")) == [f"rank_{r}" for r in range(4)]
    assert "rank 3" in (hang / "stacks.txt").read_text()
    kept = json.loads((hang / "stacks.json").read_text())
    wanted = "py-spy --native" if node_python == "with py-spy" else "faulthandler"  # a hang report: every frame
    assert {r["method"] for node in kept for r in node["ranks"]} == {wanted}
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "failed" and record["exit_code"] == 124
    assert record["first_failure"]["rank"] == 3 and record["first_failure"]["hang_dir"] == str(hang)
    # the goodput account: from the last step every rank finished to the watchdog's verdict, a hang
    counted = json.loads(run(lab, tmp_path, "status", run_dir.name, "--json").stdout)["goodput"]
    assert HANG_TIMEOUT <= counted["seconds"]["hang"] <= fired_after + 2, counted
    status = run(lab, tmp_path, "status", run_dir.name).stdout
    assert "hung: no progress for" in status and str(hang) in status
    later = run(lab, tmp_path, "stacks", run_dir.name)
    assert later.returncode == 2 and "no rank is running" in later.stderr and "runs/<id>/hang/" in later.stderr
    deadline = time.monotonic() + 15
    while processes_of(run_dir.name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(run_dir.name)


def test_a_segfaulting_rank_shows_its_python_stack_and_rank(lab, tmp_path):
    project = write_project(tmp_path / "project")
    result = run(lab, tmp_path, "launch", "-p", str(hang_profile(lab, tmp_path, sys.executable)), "--nproc-per-node",
                 "2", "--code", str(project), "--env", "SEGV_RANK=2", "--", "train.py")
    assert result.returncode == 139, result.stderr[-3000:]  # 128 + SIGSEGV, as a shell says it
    err = result.stderr
    assert f"FAILED: rank 2 (local rank 0) on {lab.hosts['n2'].address} (node 1) exited 139" in err, err[-3000:]
    summary = err.split("last lines:")[1]
    assert "[rank2]:Fatal Python error: Segmentation fault" in summary
    assert re.search(r'\[rank2\]:  File ".*/proj/train\.py", line \d+ in read_a_null_pointer', summary), summary
    assert not processes_of(run_dir_of(tmp_path).name)


def test_logs_follow_of_a_detached_run_reports_and_ends_a_hang_the_same_way(lab, tmp_path):
    project = write_project(tmp_path / "project")
    started = run(lab, tmp_path, "launch", "-p", str(hang_profile(lab, tmp_path, sys.executable)), "--detach",
                  "--hang-timeout", str(HANG_TIMEOUT), "--code", str(project), "--env", "STEPS=1000", "--env",
                  "HANG_RANK=1", "--", "train.py")
    assert started.returncode == 0, started.stderr[-2000:]
    run_id = started.stdout.strip()
    followed = run(lab, tmp_path, "logs", "-f", run_id, timeout=120)
    assert followed.returncode == 124, followed.stderr[-3000:]
    assert "no progress for" in followed.stderr and "flight recorder: rank(s) 1 never entered collective" in \
        followed.stderr, followed.stderr[-3000:]
    assert (tmp_path / "runs" / run_id / "hang" / "stacks.json").is_file()
    deadline = time.monotonic() + 15
    while processes_of(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(run_id)


def test_a_failed_run_brings_back_the_flight_recorder_dumps_torch_wrote(lab, tmp_path):
    """torch's NCCL watchdog dumps every rank's flight recorder into flight/on-timeout/ (fsdpctl points
    it there) before the ranks abort; gloo has no such watchdog, so the program writes the same real
    dumps there itself, then rank 1 fails (exit 3): named, said before the dumps are read, and nothing
    of the run left on either node."""
    project = write_project(tmp_path / "project")
    result = run(lab, tmp_path, "launch", "-p", str(hang_profile(lab, tmp_path, sys.executable)), "--code",
                 str(project), "--env", "DUMP_FLIGHT_RECORDER=1", "--env", "FAIL_RANK=1", "--", "train.py")
    assert result.returncode == 3, result.stderr[-3000:]
    failed = f"FAILED: rank 1 (local rank 0) on {lab.hosts['n2'].address} (node 1) exited 3"
    dumps = "fsdpctl: flight recorder, dumped by torch when the collective timed out:"
    assert failed in result.stderr and "rank 1 failing on purpose" in result.stderr, result.stderr[-3000:]
    assert dumps in result.stderr and result.stderr.index(failed) < result.stderr.index(dumps)
    assert "  on-timeout: dumps of rank(s) 0,1" in result.stderr, result.stderr[-3000:]
    run_dir = run_dir_of(tmp_path)
    kept = run_dir / "flight" / "on-timeout"
    assert sorted(p.name for p in kept.glob("rank_*")) == ["rank_0", "rank_1"]
    assert not list((run_dir / "fetched").rglob("rank_*"))  # copied as each node ended, straight to their place
    assert not processes_of(run_dir.name)
