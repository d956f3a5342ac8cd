"""Spare hosts on the namespace testbed: a node whose link goes down mid-run is replaced by the
first spare that passes its checks (one added to the profile while the run went counts), and the
run finishes with an uninterrupted run's losses.

Hosts n1 and n2 run; n3 (another torch: it fails the checks) and n4 (its card named eth1) are the
spares; the launcher runs in its own namespace, outside the profile. The bundled workload saves a
checkpoint every 10 of its 40 steps; a link is cut once step 15 is logged (n1's: it holds the
rendezvous, which moves to the spare).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_launch import TRAIN, processes_of, run, run_dir_of, start, wait_for_line
from tests.integration.test_resume import WORKLOAD, metrics

pytestmark = pytest.mark.integration

NODE_TIMEOUT = "8"


def spares_profile(lab, tmp_path: Path, spares=("n3", "n4"), name: str = "spared") -> Path:
    lines = "".join(f"  - host: {lab.hosts[n].address}\n    port: {lab.hosts[n].port}\n"
                    + ("    interface: eth1\n" if n == "n4" else "") for n in spares)
    path = tmp_path / f"{name}.yaml"
    path.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable, name=name)
                    + (f"spares:\n{lines}" if spares else "") + TRAIN.format(steps=40))
    return path


@pytest.fixture(scope="module")
def straight(lab, tmp_path_factory):
    """The losses of the same run, uninterrupted, on n1 and n2."""
    tmp_path = tmp_path_factory.mktemp("straight")
    result = run(lab, tmp_path, "launch", "-p", str(spares_profile(lab, tmp_path, spares=())), *WORKLOAD)
    assert result.returncode == 0, result.stderr[-3000:]
    return metrics(run_dir_of(tmp_path))[0]


class Cut:
    """A host's link taken down (and always brought back up)."""

    def __init__(self, lab, name: str, card: str = "eth0"):
        self.argv = ["ip", "-n", lab.hosts[name].namespace, "link", "set", card]

    def __enter__(self) -> Cut:
        subprocess.run([*self.argv, "down"], check=True, timeout=10)
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run([*self.argv, "up"], check=True, timeout=10)


def launch_and_cut(lab, tmp_path: Path, profile: Path, victim: str, *extra: str, before_cut=None):
    launcher = start(lab, tmp_path, "launch", "-p", str(profile), "--max-restarts", "1", "--node-timeout",
                     NODE_TIMEOUT, *WORKLOAD, *extra)
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=15 loss=")
    if before_cut is not None:
        before_cut()
    with Cut(lab, victim):
        code, out, err = launcher.finish(timeout=240)
    return code, err, run_dir


def test_a_node_that_loses_its_link_is_replaced_by_the_first_good_spare_and_the_run_finishes(lab, tmp_path,
                                                                                            straight):
    """The node lost is n1, which holds the rendezvous: the spare takes its place there too. The run
    starts with n3 its only spare; n4 is added to the profile file while it goes."""
    n1, n2, n3, n4 = (lab.hosts[n].address for n in ("n1", "n2", "n3", "n4"))
    profile = spares_profile(lab, tmp_path, spares=("n3",))
    whole = spares_profile(lab, tmp_path, name="whole").read_text().replace("name: whole", "name: spared")
    code, err, run_dir = launch_and_cut(lab, tmp_path, profile, "n1", before_cut=lambda: profile.write_text(whole))
    replacing = [line for line in err.splitlines() if "spare" in line or "replaces" in line or "attempt 2" in line]
    print("\n--- the launcher, on the replacement ---\n" + "\n".join(replacing))
    assert code == 0, err[-3000:]
    assert f"profile spared: spares now {n3}, {n4} ({n4} added; read from {profile})" in err
    assert f"spare {n3} failed its check and is excluded until restored: torch 2.99.0+fake" in err
    assert "spare host(s) checked: none pass" in err  # at launch n3 was the only spare, and it failed
    assert f"{n4} replaces {n1} for attempt 2: lost: nothing heard from it since" in err
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["master_host"] == n4 and [n["host"] for n in plan["nodes"]] == [n4, n2]
    losses, _ = metrics(run_dir)
    assert sorted(losses) == list(range(1, 41)) and losses == straight, "the spare's run trains as an uninterrupted one"

    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempt"] == 2 and record["from_step"] == 10
    assert [n["host"] for n in record["nodes"]] == [n4, n2]
    assert [n["host"] for n in record["attempts"][0]["nodes"]] == [n1, n2]
    assert [(r["host"], r["by"]) for r in record["replacements"]] == [(n1, n4)]
    recovery = record["recovery"]
    assert recovery["stood_still_s"] > int(NODE_TIMEOUT) and recovery["steps_redone"] >= 5, recovery
    status = run(lab, tmp_path, "status", run_dir.name).stdout
    print(f"--- status ---\n{status}")
    assert f"attempt 2: {n4} in the place of {n1} (lost: nothing heard from it since" in status
    assert f"stood still {recovery['stood_still_s']:.1f} s, {recovery['steps_redone']} step(s) done again" in status
    # where each global rank is after the replacement: c10d ranks the nodes by address, n2's below n4's
    assert f"node 0 {n4} (global rank 1): succeeded" in status and f"node 1 {n2} (global rank 0): succeeded" in status

    reported = run(lab, tmp_path, "report", run_dir.name)
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert f"attempt 2: {n4} in the place of {n1} (lost: nothing heard" in reported.stdout

    listed = run(lab, tmp_path, "hosts", "-p", str(profile))
    print(f"--- hosts ---\n{listed.stdout}")
    assert listed.stdout.splitlines()[:2] == [f"{n4}\tactive\tnode 0 in the place of {n1}", f"{n2}\tactive\tnode 1"]
    excluded = {h["host"]: h for h in json.loads(run(lab, tmp_path, "hosts", "-p", str(profile), "--json").stdout)
                if h["role"] == "excluded"}
    assert excluded[n1]["reason"].startswith("lost: nothing heard") and excluded[n1]["run_id"] == run_dir.name
    assert excluded[n3]["reason"].startswith("failed the preflight: torch 2.99.0+fake")

    again = run(lab, tmp_path, "launch", "-p", str(profile), "--dry-run", "--json")
    assert again.returncode == 0, again.stderr
    assert [n["host"] for n in json.loads(again.stdout)["plan"]["nodes"]] == [n4, n2]
    assert f"{n4} runs in the place of {n1}, excluded: lost: nothing heard" in again.stderr

    restored = run(lab, tmp_path, "hosts", "-p", str(profile), "--restore", n1)
    assert restored.returncode == 0, restored.stderr[-2000:]
    assert run(lab, tmp_path, "hosts", "-p", str(profile)).stdout.splitlines()[:3] == [
        f"{n1}\tactive\tnode 0", f"{n2}\tactive\tnode 1", f"{n4}\tspare"]
    refused = run(lab, tmp_path, "hosts", "-p", str(profile), "--restore", n3)
    assert refused.returncode == 2 and f"--restore {n3}: it still fails its check (torch" in refused.stderr
    assert not processes_of(run_dir.name)


def test_with_no_spare_left_a_dead_host_ends_the_run_at_once_and_the_next_launch_is_refused(lab, tmp_path):
    """An elastic profile that may not go below its two nodes ends the same way, saying so."""
    n2 = lab.hosts["n2"].address
    profile = spares_profile(lab, tmp_path, spares=(), name="bare")
    profile.write_text(profile.read_text() + "max_restarts: 1\nelastic:\n  min_nodes: 2\n")
    started = time.monotonic()
    code, err, run_dir = launch_and_cut(lab, tmp_path, profile, "n2")
    took = time.monotonic() - started
    print(f"\nno spare: exit {code} after {took:.1f} s: {err.strip().splitlines()[-1]}")
    assert code == 255, err[-3000:]
    assert (f"run {run_dir.name} ends: 1 of its 2 hosts excluded and no spare left ({n2}: failed the re-check: "
            in err), err[-3000:]
    assert "1 host(s) missing; fewer than min_nodes 2 left" in err and "attempt 2 of 2" in err
    refused = run(lab, tmp_path, "launch", "-p", str(profile), "--dry-run")
    assert refused.returncode == 2 and "no spare left" in refused.stderr and "--restore" in refused.stderr
    assert "fewer than min_nodes 2 left" in refused.stderr
    assert not processes_of(run_dir.name, node_rank=0)
