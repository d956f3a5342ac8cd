"""The user's own training script through `fsdpctl launch -- ...` on the namespace testbed:
their code copied to both nodes, their arguments verbatim, failures, interruption, detach, fetch,
requirements parity and the code size limit."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_launch import processes_of, run, run_dir_of, start, wait_for_line, write_profile
from tests.integration.user_project import write_project

pytestmark = pytest.mark.integration

# Every kind of word a shell could mistake for code, and a few it could mangle.
ARGUMENTS = ["plain", "two words", "it's", 'say "hi"', "$(touch PWNED-subst)", "`touch PWNED-tick`",
             "a; touch PWNED-semi", "*", "?.py", "~", "$HOME", "héllo ✓", "", "--flag=value", "-m",
             "line one\nline two", "back\\slash", "tab\there"]


@pytest.fixture
def project(tmp_path) -> Path:
    return write_project(tmp_path / "project")


def node_run_dir(lab, run_id: str) -> Path:
    return lab.root / "work" / "runs" / run_id  # the lab's hosts share this machine's filesystem


def records(lab, run_id: str) -> dict[int, dict]:
    out = node_run_dir(lab, run_id) / "out"
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def test_a_git_project_runs_on_two_nodes_with_its_arguments_verbatim(lab, tmp_path, project):
    profile = write_profile(lab, tmp_path)
    result = run(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), "--env", "EXTRA=x y",
                 "--requirements", str(project / "requirements.txt"), "--", "train.py", *ARGUMENTS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_id = run_dir_of(tmp_path).name
    address = {name: lab.hosts[name].address for name in ("n1", "n2")}
    assert f"[{address['n1']} r0] user step=4 loss=" in result.stdout
    assert f"[{address['n2']}] fsdpctl: node 1 of 2 on n2 " in result.stdout
    got = records(lab, run_id)
    assert sorted(got) == [0, 1] and {r["host"] for r in got.values()} == {"n1", "n2"}
    for record in got.values():
        assert record["argv"] == ARGUMENTS  # byte for byte, on every rank
        assert record["cwd"] == str(node_run_dir(lab, run_id) / "code") and record["extra"] == "x y"
    code = node_run_dir(lab, run_id) / "code"
    assert (code / "proj" / "model.py").is_file() and (code / ".gitignore").is_file()
    assert not (code / "data").exists() and not (code / ".git").exists()  # what git would commit, only
    assert not list(tmp_path.rglob("PWNED*")) and not list(lab.root.rglob("PWNED*"))
    assert not processes_of(run_id)


def test_the_module_form_fetch_and_the_dry_run_on_uneven_nodes(lab, tmp_path, project):
    """Two ranks on n1 and one on n2 (hosts[].nproc): world size 3, global ranks across both nodes."""
    profile = write_profile(lab, tmp_path)
    n1 = f"port: {lab.hosts['n1'].port}\n"
    profile.write_text(profile.read_text().replace(n1, n1 + "    nproc: 2\n", 1))
    dry = run(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), "--dry-run",
              "--", "-m", "proj.train", "--lr", "0.1")
    assert dry.returncode == 0, dry.stderr
    assert "2 node(s) x 2+1 process(es), world size 3" in dry.stdout
    assert "# every rank runs: -m proj.train --lr 0.1  (in code of the run directory)" in dry.stdout
    assert "# code: 6 files, " in dry.stdout and "what git would commit" in dry.stdout
    assert "--tee 3 -m proj.train --lr 0.1" in dry.stdout and not (tmp_path / "runs").exists()
    result = run(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), "--fetch", "out",
                 "--", "-m", "proj.train", "--lr", "0.1")
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_dir_of(tmp_path)
    fetched = sorted(p.relative_to(run_dir / "fetched").as_posix() for p in (run_dir / "fetched").rglob("*.json"))
    assert "node0/out/rank0.json" in fetched and "node1/out/rank1.json" in fetched
    assert json.loads((run_dir / "fetched" / "node1" / "out" / "rank1.json").read_text())["argv"] == ["--lr", "0.1"]
    again = run(lab, tmp_path, "fetch", run_dir.name, "out/rank0.json")
    assert again.returncode == 0 and "rank0.json" in again.stderr
    got = records(lab, run_dir.name)
    assert sorted(got) == [0, 1, 2] and {r["world"] for r in got.values()} == {3}
    by_host = {host: sorted((r["local_rank"], r["local_world"]) for r in got.values() if r["host"] == host)
               for host in ("n1", "n2")}
    assert by_host == {"n1": [(0, 2), (1, 2)], "n2": [(0, 1)]}


def test_no_code_runs_in_place_on_shared_storage(lab, tmp_path, project):
    profile = write_profile(lab, tmp_path)
    result = run(lab, tmp_path, "launch", "-p", str(profile), "--no-code", "--chdir", str(project),
                 "--", "train.py", "in-place")
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = run_dir_of(tmp_path).name
    assert {r["cwd"] for r in records(lab, run_id).values()} == {str(project)}
    assert not (node_run_dir(lab, run_id) / "code").exists()


# A rank exiting 3 ends the run with 3 and is named: test_hangs' flight-recorder test (the same project).


def test_ctrl_c_detach_logs_status_and_stop(lab, tmp_path, project):
    profile = write_profile(lab, tmp_path)
    long = ["--env", "STEPS=100000", "--env", "STEP_SLEEP=0.05", "--", "train.py"]
    launcher = start(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), *long)
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"user step=\d+")
    launcher.process.send_signal(signal.SIGINT)
    code, _, err = launcher.finish(timeout=60)
    assert code == 130, err[-2000:]
    assert not processes_of(run_dir.name)

    detached = run(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), "--detach", *long)
    assert detached.returncode == 0, detached.stderr[-2000:]
    run_id = detached.stdout.strip()
    follower = start(lab, tmp_path, "logs", "-f", run_id)
    deadline = time.monotonic() + 60
    while not (node_run_dir(lab, run_id) / "node0.log").exists() or \
            "user step=" not in (node_run_dir(lab, run_id) / "node0.log").read_text():
        assert time.monotonic() < deadline, "the detached run printed no step"
        time.sleep(0.5)
    status = json.loads(run(lab, tmp_path, "status", run_id, "--json").stdout)
    assert status["state"] == "running" and [n["state"] for n in status["nodes"]] == ["running", "running"]
    assert run(lab, tmp_path, "stop", run_id).returncode == 0
    code, out, _ = follower.finish(timeout=60)
    assert "user step=" in out
    assert not processes_of(run_id)


def test_workload_flags_next_to_a_command_are_refused(lab, tmp_path, project):
    result = run(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path)), "--steps", "5", "--", "train.py")
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == ("error: --steps: a setting of the bundled workload, and your own "
                                             "program runs instead")


def test_code_over_the_size_limit_is_refused_naming_the_largest_files(lab, tmp_path):
    project = write_project(tmp_path / "big", git=False)
    (project / "weights.pt").write_bytes(b"\1" * 1_500_000)
    result = run(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path)), "--code", str(project),
                 "--code-limit", "1", "--", "train.py")
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: --code {project}: 1.5 MB in ") and "over the 1.0 MB limit" in first
    assert "the largest: weights.pt (1.5 MB)" in first and "data/" not in first  # .fsdpctlignore'd
    assert not (tmp_path / "runs").exists()


def test_a_requirements_mismatch_fails_doctor_and_the_preflight(lab, tmp_path, project):
    fake = tmp_path / "fake-numpy"
    (fake / "numpy-0.0.1.dist-info").mkdir(parents=True)
    (fake / "numpy-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 0.0.1\n")
    python = tmp_path / "python-per-host"  # n2's Python sees another numpy
    python.write_text(f'#!/bin/sh\n[ "$(hostname)" = n2 ] && export PYTHONPATH={fake}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    profile = tmp_path / "lab.yaml"
    profile.write_text(write_profile(lab, tmp_path).read_text().replace(f"python: {sys.executable}",
                                                                        f"python: {python}"))
    requirements = project / "requirements.txt"
    doctor = run(lab, tmp_path, "doctor", "-p", str(profile), "--requirements", str(requirements), "--json")
    assert doctor.returncode == 1
    parity = {p["fact"]: p for p in json.loads(doctor.stdout)["parity"]}
    assert parity["numpy"]["status"] == "fail" and f"{lab.hosts['n2'].address}=0.0.1" in parity["numpy"]["detail"]
    launched = run(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), "--requirements",
                   str(requirements), "--", "train.py")
    assert launched.returncode == 1 and "preflight failed; nothing was started" in launched.stderr
    assert "0.0.1" in launched.stdout
    assert not list(tmp_path.glob("runs/*/run.json"))


def test_a_job_file_keeps_the_whole_job(lab, tmp_path, project):
    jobs = project / "jobs"
    jobs.mkdir()
    profile = write_profile(lab, tmp_path)
    (jobs / "nightly.yaml").write_text(
        f"name: nightly\nprofile: {profile}\ncommand: [train.py, --from-job, \"a b\"]\ncode: ..\n"
        f"env:\n  EXTRA: from-the-job\n  STEPS: \"2\"\nrequirements_file: ../requirements.txt\nfetch: [out]\n")
    result = run(lab, tmp_path, "launch", "--job", str(jobs / "nightly.yaml"))
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_dir_of(tmp_path)
    record = json.loads((run_dir / "fetched" / "node0" / "out" / "rank0.json").read_text())
    assert record["argv"] == ["--from-job", "a b"] and record["extra"] == "from-the-job"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["requirements"] == ["torch", "numpy", "torch>=2.6"]
