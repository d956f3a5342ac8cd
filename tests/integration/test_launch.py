"""fsdpctl launch on the namespace testbed: real sshd hosts, real torchrun, gloo over eth0; what the
command itself owns (its exit codes, its one-line failure summary, Ctrl-C, two launches at once, a
refused preflight). Training runs through the Python API are in test_api.py.

fsdpctl runs in the client namespace; n1 is the master, n2's shell is chatty (prints on stdout).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.testbed.lab import named_on_hosts, processes_of

pytestmark = pytest.mark.integration

TRAIN = ("train:\n  preset: tiny\n  steps: {steps}\n  batch_size: 4\n  seq_len: 64\n  log_interval: 2\n"
         "  eval_interval: 0\n  eval_steps: 2\n  vocab_size: 2000\n")


def write_profile(lab, tmp_path: Path, names=("n1", "n2"), steps: int = 8, name: str = "lab") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(lab.profile_yaml(list(names), python=sys.executable, name=name) + TRAIN.format(steps=steps))
    return path


def fsdpctl(lab, tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "HOME": str(tmp_path), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    return lab.in_client([sys.executable, "-m", "fsdpctl", *args]), env


def run(lab, tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    argv, env = fsdpctl(lab, tmp_path, *args)
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:  # what it said before it was killed: where it waited
        said = [(part or b"").decode(errors="replace") if isinstance(part, bytes) else part or ""
                for part in (exc.stdout, exc.stderr)]
        raise AssertionError(f"fsdpctl {' '.join(args[:1])} did not end within {timeout:g} s; its stdout's end:\n"
                             f"{said[0][-4000:]}\nits stderr's end:\n{said[1][-4000:]}") from None


class Started:
    """A command running in the background whose output goes to files (a pipe nobody reads
    would fill up and block it, as no terminal would)."""

    def __init__(self, lab, tmp_path: Path, *args: str):
        argv, env = fsdpctl(lab, tmp_path, *args)
        self.out_path = tmp_path / f"out-{time.monotonic_ns()}"
        self.err_path = self.out_path.with_suffix(".err")
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=tmp_path)

    def finish(self, timeout: float) -> tuple[int, str, str]:
        code = self.process.wait(timeout=timeout)
        return code, self.out_path.read_text(), self.err_path.read_text()


def start(lab, tmp_path: Path, *args: str) -> Started:
    return Started(lab, tmp_path, *args)


def run_dir_of(tmp_path: Path, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = sorted((tmp_path / "runs").glob("*/run.json"))
        if runs:
            return runs[-1].parent
        time.sleep(0.2)
    raise AssertionError("no run directory appeared")


def wait_for_line(path: Path, pattern: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and re.search(pattern, path.read_text(errors="replace")):
            return
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in {path}")


def losses(merged: str) -> list[float]:
    return [float(m) for m in re.findall(r"\bstep=\d+ loss=([0-9.]+)", merged)]


def test_kill_9_on_one_node_ends_the_run_everywhere(lab, tmp_path):
    launcher = start(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path, steps=5000)))
    run_dir = run_dir_of(tmp_path)
    run_id = run_dir.name
    wait_for_line(run_dir / "logs" / "merged.log", r"step=\d+ loss=")
    torchrun = [p for p in processes_of(run_id, node_rank=1)
                if b"torch.distributed.run" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(torchrun) == 1, torchrun
    killed_at = time.monotonic()
    os.kill(torchrun[0], signal.SIGKILL)
    code, out, err = launcher.finish(timeout=60)
    assert time.monotonic() - killed_at < 30, "launch did not end within 30 s"
    assert code != 0
    assert f"FAILED: {lab.hosts['n2'].address} (node 1) exited 137" in err, err[-2000:]
    deadline = time.monotonic() + 30
    while processes_of(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(run_id), "processes of the run remain"
    assert json.loads((run_dir / "run.json").read_text())["state"] == "failed"


def workload_workers(run_id: str, node_rank: int) -> list[int]:
    """The bundled workload's rank processes of one node (not its torchrun)."""
    return [p for p in processes_of(run_id, node_rank=node_rank)
            if b"fsdpctl.workload.train" in Path(f"/proc/{p}/cmdline").read_bytes()
            and b"torch.distributed.run" not in Path(f"/proc/{p}/cmdline").read_bytes()]


def test_a_killed_worker_is_named_with_its_global_rank(lab, tmp_path):
    launcher = start(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path, steps=5000)))
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=\d+ loss=")
    workers = workload_workers(run_dir.name, 1)
    assert len(workers) == 1, workers
    assert len(named_on_hosts(lab, "fsdpctl.workload.train")) == 4  # a rank and its torchrun on each node
    killed_at = time.monotonic()
    os.kill(workers[0], signal.SIGKILL)
    # As a user counts it: `ps | grep` for the program on each node, while the launcher may still be
    # gathering the failure (the ranks, their torchrun, nothing of the run may hold a port or a GPU).
    while named_on_hosts(lab, "fsdpctl.workload.train") and time.monotonic() - killed_at < 10:
        time.sleep(0.05)
    print(f"\nno process naming the program on either node {time.monotonic() - killed_at:.2f} s after the kill")
    assert not named_on_hosts(lab, "fsdpctl.workload.train"), named_on_hosts(lab, "fsdpctl.workload.train")
    code, out, err = launcher.finish(timeout=90)
    assert code == 128 + signal.SIGKILL, err[-2000:]
    assert f"FAILED: rank 1 (local rank 0) on {lab.hosts['n2'].address} (node 1) exited 137" in err, err[-2000:]
    failure = json.loads((run_dir / "run.json").read_text())["first_failure"]
    assert failure["rank"] == 1 and failure["local_rank"] == 0
    assert not processes_of(run_dir.name)


def test_ctrl_c_stops_every_node_and_exits_130(lab, tmp_path):
    launcher = start(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path, steps=5000)))
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=\d+ loss=")
    launcher.process.send_signal(signal.SIGINT)
    code, out, err = launcher.finish(timeout=60)
    assert code == 130, err[-2000:]
    assert not processes_of(run_dir.name)
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"


def test_two_runs_at_once_on_the_same_hosts(lab, tmp_path):
    first = start(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path, steps=6, name="one")))
    second = start(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path, steps=6, name="two")))
    results = [p.finish(timeout=300) for p in (first, second)]
    assert [code for code, _, _ in results] == [0, 0], [err[-1500:] for _, _, err in results]
    plans = [json.loads(p.read_text()) for p in sorted((tmp_path / "runs").glob("*/plan.json"))]
    assert len({p["run_id"] for p in plans}) == 2
    assert len({p["master_port"] for p in plans}) == 2


def test_unreachable_host_is_refused_by_the_preflight(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    profile.write_text(profile.read_text().replace(lab.hosts["n2"].address, lab.unused_address()))
    result = run(lab, tmp_path, "launch", "-p", str(profile), timeout=60)
    assert result.returncode == 1
    assert "no answer from" in result.stdout + result.stderr
    assert "preflight failed; nothing was started" in result.stderr
    assert not list((tmp_path / "runs").glob("*/run.json"))
