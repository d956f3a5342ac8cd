"""Elastic runs on the namespace testbed: a node lost with no spare left, and the run goes on with
the nodes left, its global batch kept; a second run that starts short grows back once the host is
restored. Hosts n1, n2 and n4 (its card named eth1) run; nothing stands by. The bundled workload
saves a checkpoint every 10 of its 30 steps; n4's link is cut once step 12 is logged.

The module's tests share one home (the profile's exclusions) and follow on from each other.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_launch import TRAIN, processes_of, run, start, wait_for_line
from tests.integration.test_resume import metrics
from tests.integration.test_spares import Cut

pytestmark = pytest.mark.integration

NODE_TIMEOUT = "8"
STEPS = 30
WORKLOAD = ("--set", "checkpoint_interval=10", "--set", "log_interval=1", "--batch-size", "8", "--set",
            "seq_len=128")


def elastic_profile(lab, home: Path, min_nodes: int = 2) -> Path:
    text = lab.profile_yaml(["n1", "n2", "n4"], python=sys.executable, name="stretchy")
    n4 = lab.hosts["n4"]
    text = text.replace(f"  - host: {n4.address}\n    port: {n4.port}\n",
                        f"  - host: {n4.address}\n    port: {n4.port}\n    interface: eth1\n")
    path = home / f"stretchy-{min_nodes}.yaml"
    path.write_text(text + f"max_restarts: 2\nelastic:\n  min_nodes: {min_nodes}\n" + TRAIN.format(steps=STEPS))
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("elastic")


@pytest.fixture(autouse=True)
def shared_state(home, monkeypatch):
    """The exclusions the first test leaves are the second's to restore."""
    monkeypatch.setenv("FSDPCTL_STATE_DIR", str(home / "state"))


def new_run(home: Path, before: set[str]) -> Path:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = {p.parent for p in (home / "runs").glob("*/run.json")} - {home / "runs" / b for b in before}
        if found:
            return found.pop()
        time.sleep(0.2)
    raise AssertionError("no new run directory appeared")


def runs_in(home: Path) -> set[str]:
    return {p.parent.name for p in (home / "runs").glob("*/run.json")}


@pytest.fixture(scope="module")
def straight(lab, home):
    """The losses of the same run, uninterrupted, on all three hosts."""
    profile = elastic_profile(lab, home)
    before = runs_in(home)
    result = run(lab, home, "launch", "-p", str(profile), *WORKLOAD)
    assert result.returncode == 0, result.stderr[-3000:]
    return metrics(new_run(home, before))[0]


def close(losses: dict[int, float], straight: dict[int, float]) -> None:
    assert sorted(losses) == sorted(straight) == list(range(1, STEPS + 1))
    worst = max(abs(losses[s] - straight[s]) / straight[s] for s in straight)
    print(f"final loss {losses[STEPS]:.5f} vs uninterrupted {straight[STEPS]:.5f}; worst step {100 * worst:.3f} %")
    assert abs(losses[STEPS] - straight[STEPS]) / straight[STEPS] < 0.005
    assert worst < 0.005


def test_a_lost_node_with_no_spare_left_and_the_run_finishes_on_the_two_left(lab, home, straight):
    n1, n2, n4 = (lab.hosts[n].address for n in ("n1", "n2", "n4"))
    profile = elastic_profile(lab, home)
    before = runs_in(home)
    launcher = start(lab, home, "launch", "-p", str(profile), "--node-timeout", NODE_TIMEOUT, *WORKLOAD)
    run_dir = new_run(home, before)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=12 loss=")
    viewer = start(lab, home, "logs", "-f", run_dir.name)  # from another shell: follows on into attempt 2
    with Cut(lab, "n4", "eth1"):
        code, out, err = launcher.finish(timeout=240)
    print("\n--- the launcher, on the shrink ---\n" + "\n".join(
        line for line in err.splitlines() if "attempt 2" in line or "goes on" in line or "elastic" in line))
    assert code == 0, err[-3000:]
    seen, seen_out, seen_err = viewer.finish(timeout=90)
    assert seen == 0 and f"run {run_dir.name}: attempt 2, started by its launcher" in seen_err, seen_err[-3000:]
    assert "succeeded; last step 30" in seen_err
    assert f"{n4}: lost: nothing heard from it since" in err and "attempt 2 goes on without it (elastic)" in err
    assert f"goes on: attempt 2 runs on 2 of 3 nodes: {n4} out (lost: nothing heard from it since" in err, err[-3000:]
    assert "global batch 24 kept: batch 6 x accumulation 2 per rank (elastic, min_nodes 2)" in err
    losses, rows = metrics(run_dir)
    close(losses, straight)
    node_log = (run_dir / "logs" / "node0.log").read_text()
    assert "elastic: 2 of the run's 3 ranks; global batch 24 kept: batch 6 x accumulation 2 per rank" in node_log

    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempt"] == 2 and record["from_step"] == 10
    assert [n["host"] for n in record["nodes"]] == [n1, n2] and record["num_nodes"] == 2
    assert record["resize"]["nodes"] == 2 and record["resize"]["full"] == 3 and record["resize"]["hosts"] == [n4]
    assert record["recovery"]["steps_redone"] >= 2 and record["recovery"]["tok_s_after"] > 0, record["recovery"]
    status = run(lab, home, "status", run_dir.name).stdout
    print(f"--- status ---\n{status}")
    assert f"attempt 2: runs on 2 of 3 nodes: {n4} out (lost: nothing heard from it since" in status
    assert "tok/s" in status and "stood still" in status
    excluded = {h["host"]: h for h in json.loads(run(lab, home, "hosts", "-p", str(profile), "--json").stdout)
                if h["role"] == "excluded"}
    assert excluded[n4]["run_id"] == run_dir.name
    assert not processes_of(run_dir.name)

    # Below min_nodes nothing starts, and the refusal says why.
    refused = run(lab, home, "launch", "-p", str(elastic_profile(lab, home, min_nodes=3)), "--dry-run")
    assert refused.returncode == 2 and "fewer than min_nodes 3 left" in refused.stderr, refused.stderr


def test_a_run_short_of_a_host_grows_back_at_its_next_checkpoint_once_the_host_is_restored(lab, home, straight):
    n1, n2, n4 = (lab.hosts[n].address for n in ("n1", "n2", "n4"))
    profile = elastic_profile(lab, home)
    before = runs_in(home)
    launcher = start(lab, home, "launch", "-p", str(profile), *WORKLOAD)
    run_dir = new_run(home, before)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=3 loss=")
    restored = run(lab, home, "hosts", "-p", str(profile), "--restore", n4)
    assert restored.returncode == 0, restored.stderr[-2000:]
    code, out, err = launcher.finish(timeout=240)
    print("\n--- the launcher, on growing back ---\n" + "\n".join(
        line for line in err.splitlines() if "attempt" in line or "grow" in line or "short" in line))
    assert code == 0, err[-3000:]
    assert f"runs on 2 of 3 nodes: {n4} out (" in err  # said before it starts
    assert "stopped at the checkpoint of step 10 to grow back to 3 of 3 nodes" in err
    assert f"goes on: attempt 2 grows back to 3 of 3 nodes: {n4} back" in err, err[-3000:]
    losses, _ = metrics(run_dir)
    close(losses, straight)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempt"] == 2 and record["from_step"] == 10
    assert [n["host"] for n in record["nodes"]] == [n1, n2, n4]
    assert record["attempts"][0]["state"] == "stopped" and record["attempts"][0]["resize"]["nodes"] == 2
    # the launcher stops the attempt once it has read the save's row: the step begun meanwhile may be done again
    assert record["recovery"]["steps_redone"] <= 1, record["recovery"]
    assert not processes_of(run_dir.name)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic"
SCRIPT = ("--code", str(EXAMPLE), "--", "train.py", "--pause", "0.4")


def script_losses(text: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"\] step=(\d+) loss=([\d.]+)", text)}


def test_your_own_script_that_follows_the_recipe_restarts_whole_after_its_error_and_shrinks_after_a_lost_node(
        lab, home):
    n1, n2, n4 = (lab.hosts[n].address for n in ("n1", "n2", "n4"))
    profile = elastic_profile(lab, home)
    whole = run(lab, home, "launch", "-p", str(profile), *SCRIPT)
    assert whole.returncode == 0, whole.stderr[-3000:]
    straight = script_losses(whole.stdout)
    before = runs_in(home)
    launcher = start(lab, home, "launch", "-p", str(profile), "--node-timeout", NODE_TIMEOUT, *SCRIPT, "--fail-at", "5")
    run_dir = new_run(home, before)
    wait_for_line(run_dir / "logs" / "merged.log", r"world 3 of 3 \(node count changed 0 times\): 8 x 2 samples per "
                                                   r"rank, from scratch")
    wait_for_line(run_dir / "logs" / "merged.log", r"\] step=16 loss=")
    with Cut(lab, "n4", "eth1"):
        code, out, err = launcher.finish(timeout=240)
    print("\n--- the launcher ---\n" + "\n".join(line for line in err.splitlines() if "attempt" in line))
    assert code == 0, err[-3000:]
    # The program's own error blames nobody: attempt 2 runs on all three nodes.
    assert "attempt 2 of 3 from" not in err and "attempt 2 of 3 after rank 1" in err, err[-3000:]
    assert f"goes on: attempt 3 runs on 2 of 3 nodes: {n4} out (lost: nothing heard from it since" in err
    record = json.loads((run_dir / "run.json").read_text())
    assert [n["host"] for n in record["attempts"][1]["nodes"]] == [n1, n2, n4]
    assert [n["host"] for n in record["nodes"]] == [n1, n2] and record["attempt"] == 3
    # each restart says its cause: the program's error once, then the lost node
    assert [(a["restart"]["cause"], a["restart"]["restarted"]) for a in record["attempts"]] == [
        ("program", True), ("lost", True)], record["attempts"]
    shrunk = (run_dir / "logs" / "merged.log").read_text()
    assert "world 2 of 3 (node count changed 1 times): 8 x 3 samples per rank, from step_0000010" in shrunk
    losses = script_losses(shrunk)
    assert max(losses) == 30 and min(losses) == 11
    worst = max(abs(losses[s] - straight[s]) / straight[s] for s in losses)
    print(f"final loss {losses[30]:.6f} vs uninterrupted {straight[30]:.6f}; worst step {100 * worst:.3f} %")
    assert worst < 0.005
    assert not processes_of(run_dir.name)


def record_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def wait_for_record(run_dir: Path, check, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        record = record_of(run_dir)
        if check(record):
            return record
        time.sleep(0.5)
    follower = run_dir / "live" / "follower.log"
    raise AssertionError(f"run.json never got there: {record_of(run_dir)}\n--- follower.log ---\n"
                         f"{follower.read_text() if follower.exists() else '(none)'}")


def test_a_detached_run_is_shrunk_by_its_follower_after_a_lost_node_as_the_launcher_would(lab, home):
    """The launcher returns at once; the follower it leaves behind sees n4 lost, re-checks the other
    two and starts attempt 2 on them, detached too."""
    n1, n2, n4 = (lab.hosts[n].address for n in ("n1", "n2", "n4"))
    profile = elastic_profile(lab, home)
    run(lab, home, "hosts", "-p", str(profile), "--restore", n4)  # the last test left it excluded
    started = run(lab, home, "launch", "-p", str(profile), "--detach", "--node-timeout", NODE_TIMEOUT, *SCRIPT)
    assert started.returncode == 0, started.stderr[-3000:]
    assert "does not apply to a detached run" not in started.stderr
    run_dir = home / "runs" / started.stdout.strip()
    wait_for_line(run_dir / "logs" / "merged.log", r"\] step=16 loss=")
    viewer = start(lab, home, "logs", "-f", run_dir.name)  # follows the attempts the follower starts, acts on none
    with Cut(lab, "n4", "eth1"):  # until attempt 2 runs: n4 back sooner would be no loss at all
        wait_for_record(run_dir, lambda r: r["attempt"] == 2 and r["state"] == "running", timeout=150)
    record = wait_for_record(run_dir, lambda r: r["state"] not in ("running", "starting"), timeout=150)
    said = (run_dir / "live" / "follower.log").read_text()
    print(f"\n--- follower.log ---\n{said}")
    code, out, err = viewer.finish(timeout=60)
    assert code == 0, err[-3000:]
    assert f"run {run_dir.name}: attempt 2, started by the run's follower in the background" in err, err[-3000:]
    assert "] step=30 loss=" in out + err
    assert record["state"] == "succeeded" and record["detached"] and record["attempt"] == 2, record
    assert [n["host"] for n in record["nodes"]] == [n1, n2] and record["num_nodes"] == 2
    assert record["attempts"][0]["restart"]["cause"] == "lost", record["attempts"][0]
    assert f"goes on: attempt 2 runs on 2 of 3 nodes: {n4} out (lost: " in said, said
    assert "attempt 2 of 3" in said and "re-check: preflight of 2 node(s)" in said
    assert said.rstrip().endswith("succeeded (exit 0)")
    merged = (run_dir / "logs" / "merged.log").read_text()
    assert re.search(r"world 2 of 3 \(node count changed 1 times\): 8 x 3 samples per rank, from step_00000[12]0",
                     merged), merged[:2000]
    assert max(script_losses(merged)) == 30
    # n4's ranks, cut off from a run that went on without them, end once their peers are gone
    wait = time.monotonic() + 120
    while processes_of(run_dir.name) and time.monotonic() < wait:
        time.sleep(1)
    assert not processes_of(run_dir.name)
