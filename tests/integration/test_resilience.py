"""Losing the launcher or a node's network loses nothing else: real signals, a real SIGKILL, a real
link taken down between namespaces. Every test ends with no process of its run left on any node."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_launch import (
    fsdpctl,
    processes_of,
    run,
    run_dir_of,
    start,
    wait_for_line,
    write_profile,
)
from tests.integration.test_resume import received, webhook_in

pytestmark = pytest.mark.integration

NODE_TIMEOUT = 8
GRACE = 10.0  # the launcher's and the agents' grace period between TERM and KILL


def gone_within(run_id: str, seconds: float, node_rank: int | None = None) -> float | None:
    """Seconds until no process of the run (on that node) is left, or None if some still are."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if not processes_of(run_id, node_rank):
            return time.monotonic() - started
        time.sleep(0.2)
    return None


def running_launch(lab, tmp_path: Path, *extra: str):
    launcher = start(lab, tmp_path, "launch", "-p", str(write_profile(lab, tmp_path, steps=100000)),
                     "--node-timeout", str(NODE_TIMEOUT), *extra)
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=\d+ loss=")
    assert len(processes_of(run_dir.name)) >= 4, "both nodes' torchrun and ranks"
    return launcher, run_dir


# SIGHUP goes through the same handler (backends/signals.py); a follower's SIGHUP: test_slurm's interrupted follow.
@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_sigterm_and_sighup_stop_every_node_and_exit_128_plus_the_signal(lab, tmp_path, signum):
    launcher, run_dir = running_launch(lab, tmp_path)
    launcher.process.send_signal(signum)
    code, out, err = launcher.finish(timeout=GRACE + 30)
    assert code == 128 + signum, err[-2000:]
    assert f"run {run_dir.name} interrupted by {signum.name}" in err
    assert "Traceback" not in err  # fsdpctl's own output (the nodes' torchrun may print one of its own)
    took = gone_within(run_dir.name, GRACE + 5)
    assert took is not None, "processes of the run remain"
    print(f"{signal.Signals(signum).name}: exit {code}, nothing left {took:.1f} s after the launcher ended")
    assert json.loads((run_dir / "run.json").read_text())["state"] == "interrupted"


def test_a_killed_launcher_leaves_nothing_running_after_the_node_timeout(lab, tmp_path):
    launcher, run_dir = running_launch(lab, tmp_path)
    killed_at = time.monotonic()
    launcher.process.send_signal(signal.SIGKILL)
    launcher.process.wait(timeout=10)
    took = gone_within(run_dir.name, NODE_TIMEOUT + 10)
    assert took is not None, "the nodes outlived their killed launcher"
    print(f"SIGKILL: nothing left {time.monotonic() - killed_at:.1f} s after the kill")


def test_a_node_that_loses_its_network_is_declared_lost_and_stops_by_itself(lab, tmp_path):
    launcher, run_dir = running_launch(lab, tmp_path)
    n2 = lab.hosts["n2"]
    cut = ["ip", "-n", n2.namespace, "link", "set", "eth0"]
    subprocess.run([*cut, "down"], check=True, timeout=10)
    cut_at = time.monotonic()
    try:
        code, out, err = launcher.finish(timeout=NODE_TIMEOUT + 15)
        launcher_took = time.monotonic() - cut_at
        assert code == 255, err[-2000:]
        assert f"FAILED: {n2.address} (node 1) was lost: nothing heard from it since" in err, err[-2000:]
        assert "Traceback" not in err
        node1_left = gone_within(run_dir.name, 5, node_rank=0)
        assert node1_left is not None, "node 1 (the reachable one) has processes left"
        node2_took = gone_within(run_dir.name, NODE_TIMEOUT + 10, node_rank=1)
        assert node2_took is not None, "node 2 kept its ranks while its link was down"
        print(f"link down: launcher exit {code} after {launcher_took:.1f} s; node 2 empty "
              f"{time.monotonic() - cut_at:.1f} s after the cut, its link still down")
        record = json.loads((run_dir / "run.json").read_text())
        assert record["state"] == "failed" and record["first_failure"]["lost"].startswith("nothing heard")
        status = run(lab, tmp_path, "status", run_dir.name)
        assert f"first failure: {n2.address} (node 1) was lost: nothing heard from it since" in status.stdout
    finally:
        subprocess.run([*cut, "up"], check=True, timeout=10)


def test_a_detached_run_outlives_its_launcher_and_stop_still_ends_it(lab, tmp_path):
    """Its follower, left behind, sends the run's notices (issue 63), the secret URL taken from the
    environment the launcher gave it: started, the first step, and the end the stop made."""
    profile = write_profile(lab, tmp_path, steps=100000)
    profile.write_text(profile.read_text() + "notify:\n  secrets: [LAB_NOTIFY_URL]\n"
                                             "  events: [started, first_step, failed, finished]\n")
    out = lab.root / f"received-{tmp_path.name}.jsonl"
    with webhook_in(lab, "n3", out) as port:
        argv, env = fsdpctl(lab, tmp_path, "launch", "-p", str(profile), "--node-timeout", "3", "--detach")
        env["LAB_NOTIFY_URL"] = f"json://{lab.hosts['n3'].address}:{port}/detached"
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        run_id = result.stdout.strip()
        up = time.monotonic() + 90  # its ranks started (a loaded machine takes a while)
        while len(processes_of(run_id)) < 4 and time.monotonic() < up:
            time.sleep(0.5)
        time.sleep(3 + 5)  # past the node timeout: a detached run is not bound by it
        assert len(processes_of(run_id)) >= 4, "the detached run did not outlive its launcher"
        received(out, 2, timeout=120)  # started, and its first step (a loaded machine takes a while to step)
        assert run(lab, tmp_path, "stop", run_id).returncode == 0
        assert gone_within(run_id, 15) is not None
        notices = received(out, 3)
    # the stop's exit: 143 (TERM) or, for a rank whose collective its peer's exit broke first, 1
    titles = [re.sub(r"\((exit )?\d+\)$", r"(\1N)", n["body"]["title"].split(run_id)[1]) for n in notices]
    assert titles == [" started (attempt 1)", " made its first step (N)", " stopped (exit N)"], notices
