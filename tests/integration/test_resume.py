"""Picking a failed run up where it stopped, on the namespace testbed: `launch --resume RUN_ID`,
`--max-restarts`, and the refusals.

Two nodes, one rank each; the bundled workload saves a checkpoint every 10 of its 40 steps. The
rank on node 2 is killed with SIGKILL once step 15 is logged, so the newest complete checkpoint is
step 10's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.api_driver import Background, api
from tests.integration.test_launch import (
    processes_of,
    run,
    run_dir_of,
    start,
    wait_for_line,
    workload_workers,
    write_profile,
)
from tests.integration.user_project import write_project

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "elastic"
"""README's elastic recipe, whole (tests/integration/test_elastic.py runs it through a shrink)."""

# Steps of ~0.5 s here: the kill after step 15 lands well before step 20's checkpoint.
WORKLOAD = ("--set", "checkpoint_interval=10", "--set", "log_interval=1", "--batch-size", "8", "--set",
            "seq_len=128")


def kill_rank_on_node_2_after_step_15(run_dir: Path) -> None:
    wait_for_line(run_dir / "logs" / "merged.log", r"step=15 loss=")
    workers = workload_workers(run_dir.name, 1)
    assert len(workers) == 1, workers
    os.kill(workers[0], signal.SIGKILL)


def new_run_dir(tmp_path: Path, known: Path, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (newest := run_dir_of(tmp_path)) != known:
            return newest
        time.sleep(0.2)
    raise AssertionError("the second run never appeared")


def metrics(run_dir: Path) -> tuple[dict[int, float], list[dict]]:
    """(train loss by step, every row) of the run's metrics.jsonl, on the nodes' shared run directory;
    a step written twice fails."""
    on_nodes = Path(json.loads((run_dir / "plan.json").read_text())["run_dir"])
    rows = [json.loads(line) for line in (on_nodes / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["kind"] == "train"]
    steps = [row["step"] for row in train]
    assert len(steps) == len(set(steps)), f"steps written twice: {steps}"
    return {row["step"]: row["loss"] for row in train}, rows


def final_val(rows: list[dict]) -> float:
    return [row for row in rows if row["kind"] == "val"][-1]["val_loss"]


def test_a_killed_run_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(lab, tmp_path):
    profile = str(write_profile(lab, tmp_path, steps=40))
    straight = run(lab, tmp_path, "launch", "-p", profile, *WORKLOAD)
    assert straight.returncode == 0, straight.stderr[-3000:]
    straight_losses, straight_rows = metrics(run_dir_of(tmp_path))

    first = run_dir_of(tmp_path)
    launcher = start(lab, tmp_path, "launch", "-p", profile, *WORKLOAD)
    run_dir = new_run_dir(tmp_path, first)
    kill_rank_on_node_2_after_step_15(run_dir)
    code, _, err = launcher.finish(timeout=120)
    assert code == 128 + signal.SIGKILL, err[-2000:]
    assert not processes_of(run_dir.name)

    reported, resumed = api(lab, tmp_path, f"""
        seen = []
        run = fsdpctl.get_run({run_dir.name!r})
        run.resume(on_event=seen.append)
        report({{"outcome": outcome_json(run.wait()), "attempt": run.attempt,
                "notices": [e.text for e in seen if isinstance(e, Notice)]}})
    """)
    print(f"\n--- Run.resume() ---\n{reported}")
    assert resumed.returncode == 0 and reported, resumed.stderr[-3000:]
    assert reported[0]["outcome"]["ok"] and reported[0]["attempt"] == 2
    assert f"run {run_dir.name}: attempt 2 from step 10" in reported[0]["notices"]
    merged = (run_dir / "logs" / "merged.log").read_text()
    assert "resumed_from=step_0000010" in merged and "step=40 loss=" in merged
    losses, rows = metrics(run_dir)
    assert sorted(losses) == list(range(1, 41))  # steps continue: 11-15 of the failed attempt are not kept twice
    assert losses == straight_losses, "a resumed run trains exactly as an uninterrupted one"
    assert final_val(rows) == final_val(straight_rows)
    print(f"final loss: interrupted+resumed {losses[40]!r}, uninterrupted {straight_losses[40]!r}; final val "
          f"{final_val(rows)!r} / {final_val(straight_rows)!r}")

    record = json.loads((run_dir / "run.json").read_text())
    assert record["attempt"] == 2 and record["from_step"] == 10 and record["state"] == "succeeded"
    assert [(a["attempt"], a["state"], a["exit_code"]) for a in record["attempts"]] == [(1, "failed", 137)]
    status = run(lab, tmp_path, "status", run_dir.name)
    assert "succeeded (attempt 2 from step 10)" in status.stdout, status.stdout
    assert f"attempt 1: failed (exit 137): rank 1 on {lab.hosts['n2'].address} exited 137 (SIGKILL)" in status.stdout
    first = run(lab, tmp_path, "logs", run_dir.name, "--attempt", "1")
    assert "step=15 loss=" in first.stdout and "resumed_from" not in first.stdout
    assert "exitcode  : -9" in first.stdout
    newest = run(lab, tmp_path, "logs", run_dir.name)
    assert "resumed_from=step_0000010" in newest.stdout and "step=15 loss=" not in newest.stdout.split(
        "resumed_from")[0]
    listed = next(r for r in json.loads(run(lab, tmp_path, "runs", "--json").stdout) if r["run_id"] == run_dir.name)
    assert (listed["state"], listed["backend"], listed["num_nodes"], listed["exit_code"], listed["attempt"]) == (
        "succeeded", "ssh", 2, 0, 2)
    assert not processes_of(run_dir.name)


@contextlib.contextmanager
def webhook_in(lab, host: str, out: Path):
    """A JSON webhook receiver inside ``host``'s namespace (tests.testbed.webhook); its port."""
    port = 18080
    receiver = subprocess.Popen(lab.in_host(host, [sys.executable, "-m", "tests.testbed.webhook",
                                                   lab.hosts[host].address, str(port), str(out)]),
                                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                                text=True)
    try:
        assert receiver.stdout.readline().strip() == "listening"
        yield port
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)


def received(out: Path, count: int, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = out.read_text().splitlines() if out.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        time.sleep(0.2)
    raise AssertionError(f"the receiver got {out.read_text() if out.exists() else 'nothing'}")


def test_max_restarts_starts_the_run_again_from_its_checkpoint_in_one_call(lab, tmp_path):
    """Also the notices (issue 63): a webhook receiver inside n3's namespace, named only by a secret
    whose value holds a token, gets the run's events in order; a dead target in the subnet costs the
    run nothing (the same result), and is noted once; the token is in no file."""
    token = f"tok-{secrets.token_hex(8)}"
    profile = write_profile(lab, tmp_path, steps=40)
    profile.write_text(profile.read_text() + (
        f"notify:\n  secrets: [LAB_NOTIFY_URL]\n  urls: [\"json://{lab.unused_address()}:18080/dead\"]\n"
        f"  events: [started, failed, restarted, shrunk, grown, finished]\n  timeout: 2\n"))
    out = lab.root / f"received-{tmp_path.name}.jsonl"
    with webhook_in(lab, "n3", out) as port:
        launcher = Background(lab, tmp_path, f"""
            seen = []
            run = fsdpctl.launch({str(profile)!r}, max_restarts=1, checkpoint_interval=10,
                                 log_interval=1, batch_size=8, seq_len=128, on_event=seen.append)
            report({{"outcome": outcome_json(run.wait()), "attempt": run.attempt,
                    "restarts": [[e.attempt, e.last_attempt, e.from_step, e.after] for e in seen
                                 if isinstance(e, AttemptStarting)],
                    "rechecks": [e.recheck for e in seen if isinstance(e, PreflightStarted)]}})
        """, env={"LAB_NOTIFY_URL": f"json://{lab.hosts['n3'].address}:{port}/hook/{token}"})
        run_dir = run_dir_of(tmp_path)
        kill_rank_on_node_2_after_step_15(run_dir)
        code, reported, err = launcher.finish(timeout=300)
        notices = received(out, 4)
    print(f"\n--- launch(max_restarts=1) ---\n{reported}\n--- a notice as received ---\n"
          f"{json.dumps(notices[1]['body'], indent=2)}")
    assert code == 0 and reported, err[-3000:]
    result = reported[0]
    assert result["outcome"]["ok"] and result["attempt"] == 2
    host = lab.hosts['n2'].address
    assert result["restarts"] == [[2, 2, 10, f"rank 1 on {host} exited 137 (SIGKILL)"]]
    assert result["rechecks"] == [False, True]
    losses, _ = metrics(run_dir)
    assert sorted(losses) == list(range(1, 41))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["attempt"] == 2 and record["state"] == "succeeded"
    assert not processes_of(run_dir.name)

    assert [n["path"] for n in notices] == [f"/hook/{token}"] * len(notices)
    bodies = [n["body"] for n in notices]
    assert [b["message"].splitlines()[0] for b in bodies] == [
        "event: started", "event: failed", "event: restarted", "event: finished"]
    assert bodies[0]["title"] == f"fsdpctl: run {run_dir.name} started (attempt 1)"
    assert f"first failure: rank 1 on {host} exited 137 (SIGKILL)" in bodies[1]["message"]
    assert "from step: 10" in bodies[2]["message"] and "steps: 40" in bodies[3]["message"]
    assert (bodies[1]["type"], bodies[3]["type"]) == ("failure", "success")
    [note] = record["notes"]
    assert note.startswith(f"notify: a started notice to urls[0] json://{lab.unused_address()}:18080 was not sent")
    assert f"  note: {note}" in run(lab, tmp_path, "status", run_dir.name).stdout
    holding = [str(p) for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert not holding, f"the secret URL's token was written to {holding}"


def test_a_program_error_that_repeats_ends_after_one_retry_and_an_exit_code_to_restart_on_gets_every_restart(
        lab, tmp_path):
    """A program of the user's restarts whatever its checkpoints (they are its own): FSDPCTL_ATTEMPT
    counts the attempts, FSDPCTL_RUN_DIR stays the same. Its rank 1 exits 3 after its first step,
    every attempt: a restart cannot fix that, and the second attempt's same failure ends the run with
    two restarts left. Given as an exit code to restart on, it gets every restart."""
    project = write_project(tmp_path / "project")
    profile = write_profile(lab, tmp_path)
    argv = ("launch", "-p", str(profile), "--max-restarts", "2", "--code", str(project), "--env", "FAIL_RANK=1",
            "--", "train.py")
    repeated = run(lab, tmp_path, *argv)
    assert repeated.returncode == 3, repeated.stderr[-3000:]
    host = lab.hosts["n2"].address
    assert re.findall(r"fsdpctl: (attempt \d of \d) after rank 1 on \S+ exited 3", repeated.stderr) == [
        "attempt 2 of 3"], repeated.stderr[-3000:]
    said = (f"fsdpctl: not restarted: a program error (rank 1 on {host} exited 3) repeats the attempt before it at "
            f"step 1; a restart would fail the same way")
    assert said in repeated.stderr, repeated.stderr[-3000:]
    record = json.loads((run_dir_of(tmp_path) / "run.json").read_text())
    first, last = record["attempts"][0]["restart"], record["restart"]
    assert (first["cause"], first["restarted"], first["step"]) == ("program", True, 1)
    assert first["signature"] == last["signature"] == "exit 3: rank 1 failing on purpose"
    assert (last["cause"], last["restarted"]) == ("program", False) and record["attempt"] == 2, record
    status = run(lab, tmp_path, "status", record["run_id"])
    print(f"\n--- status of a run whose error repeated ---\n{status.stdout}")
    assert f"    restarted for a program error (rank 1 on {host} exited 3)" in status.stdout
    assert f"  attempt 2: {said.removeprefix('fsdpctl: ')}" in status.stdout

    profile.write_text(profile.read_text() + "restart:\n  exit_codes: [3]\n")
    result = run(lab, tmp_path, *argv)
    assert result.returncode == 3, result.stderr[-3000:]
    assert re.findall(r"fsdpctl: (attempt \d of \d) after rank 1 on \S+ exited 3", result.stderr) == [
        "attempt 2 of 3", "attempt 3 of 3"], result.stderr[-3000:]
    assert "fsdpctl: not restarted: no restart left (--max-restarts 2)" in result.stderr
    run_dir = run_dir_of(tmp_path)
    on_nodes = json.loads((run_dir / "plan.json").read_text())["run_dir"]
    seen = (Path(on_nodes) / "out" / "attempts.log").read_text().split("\n")
    assert sorted(line for line in seen if line) == sorted(
        f"rank={rank} attempt={attempt} run_dir={on_nodes}" for rank in (0, 1) for attempt in (1, 2, 3))
    record = json.loads((run_dir / "run.json").read_text())
    assert [a["attempt"] for a in record["attempts"]] == [1, 2] and record["attempt"] == 3
    assert [a["restart"]["cause"] for a in record["attempts"]] == ["exit_code", "exit_code"]
    for attempt in (1, 2):
        assert (run_dir / "attempts" / str(attempt) / "logs" / "merged.log").exists()
        assert (Path(on_nodes) / "attempts" / str(attempt) / "node1.log").exists()
    assert not processes_of(run_dir.name)


def test_stop_with_a_grace_leaves_a_checkpoint_of_the_last_step_that_resume_goes_on_from(lab, tmp_path):
    """The profile's stop signal (SIGUSR1 here: torchrun must not get it) reaches every rank at once;
    the bundled workload saves the step it stands at and exits 0; the launcher that follows the run
    ends with the run stopped; a resume goes on from that step. README's elastic recipe saves on the
    signal too. (A rank that ignores the signal, killed after the grace: tests/unit/test_stop_grace.py.)"""
    profile = write_profile(lab, tmp_path, steps=26)
    profile.write_text(profile.read_text() + "stop_signal: USR1\nstop_grace: 60\n")
    launcher = start(lab, tmp_path, "launch", "-p", str(profile), *WORKLOAD)
    run_dir = run_dir_of(tmp_path)
    wait_for_line(run_dir / "logs" / "merged.log", r"step=13 loss=")
    stopped = run(lab, tmp_path, "stop", run_dir.name, timeout=120)
    print(f"\n--- fsdpctl stop (SIGUSR1, grace 60 s) ---\n{stopped.stderr}")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    step = int(re.search(rf"run {run_dir.name} stopped after its checkpoint of step (\d+)", stopped.stderr).group(1))
    # The step it stood at, not the last interval's (10); before the run's last (26). The ranks go on while
    # `fsdpctl stop` starts and reaches them: on a loaded CI machine they stood at step 21 (CI).
    assert 13 <= step < 26, stopped.stderr
    code, _, err = launcher.finish(timeout=120)
    assert code == 128 + signal.SIGUSR1, err[-3000:]
    merged = (run_dir / "logs" / "merged.log").read_text()
    assert f"SIGUSR1 received: stopped after step {step}, checkpoint step_{step:07d}" in merged
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "stopped" and record["stop_checkpoint"] == step, record
    on_nodes = Path(record["run_dir_on_nodes"])
    assert [(on_nodes / f"node{r}.exit").read_text().strip() for r in (0, 1)] == ["0", "0"]  # saved and left
    said = run(lab, tmp_path, "status", run_dir.name)
    assert said.stdout.startswith(f"{run_dir.name}: stopped after its checkpoint of step {step}"), said.stdout

    resumed = run(lab, tmp_path, "launch", "--resume", run_dir.name, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"attempt 2 from step {step}" in resumed.stderr, resumed.stderr[-3000:]
    losses, _ = metrics(run_dir)
    assert sorted(losses) == list(range(1, 27))

    # README's elastic recipe: a program of the user's that saves on the stop signal, with SIGTERM
    profile.write_text(profile.read_text().replace("stop_signal: USR1\n", ""))
    before = run_dir
    launched = run(lab, tmp_path, "launch", "-p", str(profile), "--detach", "--code", str(EXAMPLE), "--",
                   "train.py", "--steps", "500", "--pause", "0.2")
    assert launched.returncode == 0, launched.stderr[-3000:]
    run_dir = new_run_dir(tmp_path, before)
    on_nodes = Path(json.loads((run_dir / "plan.json").read_text())["run_dir"])
    wait_for_line(on_nodes / "node0.log", r"step=3 loss=")
    stopped = run(lab, tmp_path, "stop", run_dir.name, "--grace", "60", timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    said = re.search(r"stopped after step (\d+), saved", (on_nodes / "node0.log").read_text())
    assert said, (on_nodes / "node0.log").read_text()[-2000:]
    assert (on_nodes / "checkpoints" / f"step_{int(said.group(1)):07d}" / ".metadata").exists()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "stopped" and {n.get("exit_code") for n in record["nodes"]} <= {0, None}, record
    assert not processes_of(run_dir.name)


def test_resume_refuses_an_unknown_run_a_running_run_and_a_run_without_checkpoint(lab, tmp_path):
    unknown = run(lab, tmp_path, "launch", "--resume", "lab-20260101-000000-beef")
    assert unknown.returncode == 2 and "run lab-20260101-000000-beef: not found" in unknown.stderr

    profile = str(write_profile(lab, tmp_path, steps=5000))
    detached = run(lab, tmp_path, "launch", "-p", profile, "--detach")
    assert detached.returncode == 0, detached.stderr[-2000:]
    run_id = detached.stdout.strip()
    try:
        running = run(lab, tmp_path, "launch", "--resume", run_id)
        assert running.returncode == 2, running.stderr
        assert f"run {run_id}: is still running" in running.stderr and f"fsdpctl stop {run_id}" in running.stderr
        assert len(running.stderr.strip().splitlines()) == 2  # the line and its hint, no traceback
    finally:
        assert run(lab, tmp_path, "stop", run_id).returncode == 0
    none_saved = run(lab, tmp_path, "launch", "--resume", run_id)
    assert none_saved.returncode == 2
    assert f"run {run_id}: has no complete checkpoint" in none_saved.stderr, none_saved.stderr
    assert "launch -p" not in none_saved.stderr and sys.executable not in none_saved.stderr
