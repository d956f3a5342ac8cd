"""Secrets reach the ranks and nowhere else: `--env NAME` and `secrets:` on the namespace testbed and
locally (Slurm's are in test_slurm.py): exact values on every rank, no trace in any file or command
line, `***` where a rank prints one, private run directories."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_launch import fsdpctl, processes_of, run_dir_of, wait_for_line, write_profile
from tests.integration.user_project import write_project

pytestmark = pytest.mark.integration

# Spaces, both quotes, shell syntax, a newline and non-ASCII; "zq8" makes it easy to find anywhere.
SECRET = "zq8 it's \"quoted\" $(touch PWNED) `id`; rm -rf ~\nsecond line: héllo ✓"
OTHER = "zq8-profile-secret-value"
NEEDLES = [b"zq8", "héllo ✓".encode()]


def leaks(*roots: Path) -> list[str]:
    """Files under ``roots`` that hold any part of a secret's value."""
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if any(n in data for n in NEEDLES):
                    found.append(str(path))
    return found


def readable_by_others(*roots: Path) -> list[str]:
    bad = []
    for root in roots:
        for path in [root, *root.rglob("*")]:
            if path.is_symlink():
                continue
            mode = path.stat().st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                bad.append(f"{path} {stat.filemode(mode)}")
    return bad


def command_lines_with_the_secret() -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if any(n in (proc / "cmdline").read_bytes() for n in NEEDLES):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def secret_profile(lab, tmp_path: Path) -> Path:
    path = write_profile(lab, tmp_path)
    path.write_text(path.read_text() + "secrets: [PROFILE_SECRET]\n")
    return path


def launch(lab, tmp_path: Path, *args: str, env: dict[str, str]):
    argv, base = fsdpctl(lab, tmp_path, *args)
    import subprocess

    out = tmp_path / f"out-{time.monotonic_ns()}"
    with out.open("w") as handle:
        process = subprocess.Popen(argv, env={**base, **env}, stdout=handle, stderr=subprocess.STDOUT, cwd=tmp_path)
    return process, out


def test_a_secret_reaches_every_rank_exactly_and_no_file_command_line_or_output(lab, tmp_path):
    project = write_project(tmp_path / "project")
    profile = secret_profile(lab, tmp_path)
    env = {"USER_SECRET": SECRET, "PROFILE_SECRET": OTHER}
    process, out = launch(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project),
                          "--env", "USER_SECRET", "--env", "PRINT_SECRET=1", "--env", "STEPS=30",
                          "--env", "STEP_SLEEP=0.1", "--", "train.py", env=env)
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"user step=3\b")
    while_running = command_lines_with_the_secret()  # every process of the run is alive now
    assert process.wait(timeout=180) == 0, out.read_text()[-3000:]
    assert while_running == []
    records = [json.loads(p.read_text()) for p in (lab.root / "work" / "runs" / run_dir.name / "out").glob("*.json")]
    assert len(records) == 2
    assert {r["secret_sha256"] for r in records} == {hashlib.sha256(SECRET.encode()).hexdigest()}
    printed = out.read_text()
    assert "r0] the secret is: ***" in printed and "zq8" not in printed
    shown = fsdpctl_output(lab, tmp_path, "logs", run_dir.name)
    assert "the secret is: ***" in shown and "zq8" not in shown
    node_dir = lab.root / "work" / "runs" / run_dir.name
    assert leaks(run_dir, node_dir) == []
    assert readable_by_others(run_dir, node_dir) == []
    assert json.loads((run_dir / "plan.json").read_text())["secrets"] == ["PROFILE_SECRET", "USER_SECRET"]
    assert not processes_of(run_dir.name)


def fsdpctl_output(lab, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    import subprocess

    argv, base = fsdpctl(lab, tmp_path, *args)
    done = subprocess.run(argv, env={**base, **(env or {})}, capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    return done.stdout + done.stderr


def test_dry_run_and_render_show_placeholders_and_a_missing_secret_starts_nothing(lab, tmp_path):
    project = write_project(tmp_path / "project")
    profile = secret_profile(lab, tmp_path)
    env = {"USER_SECRET": SECRET, "PROFILE_SECRET": OTHER}
    dry = fsdpctl_output(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), "--env",
                         "USER_SECRET", "--dry-run", "--", "train.py", env=env)
    assert "USER_SECRET=<secret>" in dry and "PROFILE_SECRET=<secret>" in dry and "zq8" not in dry
    rendered = fsdpctl_output(lab, tmp_path, "render", "-p", str(profile), "--code", str(project), "--env",
                              "USER_SECRET", "--out", str(tmp_path / "rendered"), "--", "train.py", env=env)
    assert "zq8" not in rendered and leaks(tmp_path / "rendered") == []
    assert ': "${USER_SECRET?fsdpctl: the secret USER_SECRET' in (tmp_path / "rendered" / "node0.sh").read_text()
    import subprocess

    argv, base = fsdpctl(lab, tmp_path, "launch", "-p", str(profile), "--code", str(project), "--env",
                         "USER_SECRET", "--", "train.py")
    base.pop("USER_SECRET", None)
    missing = subprocess.run(argv, env={**base, "PROFILE_SECRET": OTHER}, capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
    assert missing.returncode == 2
    assert missing.stderr.splitlines()[0] == "error: secret USER_SECRET: not set in the environment fsdpctl runs in"
    assert not (tmp_path / "runs").exists()


def test_a_credential_in_plain_env_is_warned_about(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    out = fsdpctl_output(lab, tmp_path, "launch", "-p", str(profile), "--env", "HF_TOKEN=hf_abc", "--dry-run")
    assert ("fsdpctl: warning: HF_TOKEN looks like a credential and is written into the run's scripts and "
            "records; pass it as a secret instead (--env HF_TOKEN, or secrets: [HF_TOKEN])") in out


def test_a_secret_reaches_local_ranks_too(tmp_path):
    import subprocess

    from tests.conftest import REPO

    project = write_project(tmp_path / "project")
    (tmp_path / "local.yaml").write_text(f"name: loc\nbackend: local\ndevice: cpu\nnproc_per_node: 2\n"
                                         f"python: {sys.executable}\nworkdir: {tmp_path}/work\n"
                                         f"network:\n  interface: lo\nsecrets: [USER_SECRET]\n")
    env = {**os.environ, "USER_SECRET": SECRET, "PYTHONPATH": str(REPO), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs")}
    done = subprocess.run([sys.executable, "-m", "fsdpctl", "launch", "-p", str(tmp_path / "local.yaml"),
                           "--code", str(project), "--env", "PRINT_SECRET=1", "--", "train.py"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the secret is: ***" in done.stdout and "zq8" not in done.stdout + done.stderr
    records = [json.loads(p.read_text()) for p in (tmp_path / "work" / "runs").glob("*/out/*.json")]
    assert {r["secret_sha256"] for r in records} == {hashlib.sha256(SECRET.encode()).hexdigest()}
    assert len(records) == 2
    assert leaks(tmp_path / "runs", tmp_path / "work") == []
    assert readable_by_others(tmp_path / "runs", tmp_path / "work") == []
