"""fsdpctl submit --slurm on a real Slurm cluster in the namespace lab (munge, slurmctld, two slurmd)."""

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
import yaml

from tests.conftest import REPO
from tests.integration.test_launch import processes_of, wait_for_line

pytestmark = pytest.mark.integration


def profile(lab, tmp_path: Path, steps: int, extra_train: str = "") -> Path:
    path = tmp_path / "slurmlab.yaml"
    path.write_text(
        f"name: slurmlab\nbackend: slurm\ndevice: cpu\nnproc_per_node: 1\npython: {sys.executable}\n"
        f"workdir: {tmp_path}/work\nnetwork:\n  interface: eth0\nslurm:\n  nodes: 2\n  time: \"10\"\n"
        f"train:\n  preset: tiny\n  steps: {steps}\n  batch_size: 4\n  seq_len: 64\n  log_interval: 2\n"
        f"  eval_interval: 0\n  eval_steps: 2\n  vocab_size: 2000\n{extra_train}")
    return path


def fsdpctl(lab, slurm, tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, **slurm.env, "HOME": str(tmp_path), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"),
           "PYTHONPATH": str(REPO)}
    return subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", *args]), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


def follow_submit(lab, slurm, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    """Start `fsdpctl submit --slurm --follow ARGS` in the client namespace; return it and the run
    directory once the job's first node log exists (a run directory that was not there before)."""
    before = set((tmp_path / "work" / "runs").glob("*"))
    env = {**os.environ, **slurm.env, "HOME": str(tmp_path), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"),
           "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "fsdpctl", "submit", "--slurm", "--follow", *args]  # before any `--`
    follower = subprocess.Popen(lab.in_client(command),
                                env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not [p for p in (tmp_path / "work" / "runs").glob("*/node0.log") if p.parent not in before] \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    found = [p for p in (tmp_path / "work" / "runs").glob("*") if p not in before]
    if not found:
        follower.kill()
        raise AssertionError(f"no run directory after 120 s: {follower.communicate()[1][-2000:]}")
    return follower, found[0]


def queue(slurm) -> str:
    return subprocess.run(slurm.client(["squeue", "-h"]), capture_output=True, text=True, timeout=30).stdout


def test_two_node_job_completes(lab, slurm, tmp_path):
    """Through sbatch (submitit's own batch script, its completion and status: the user project's
    submitit job below)."""
    result = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(profile(lab, tmp_path, 8)), "--follow")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run_id = result.stdout.strip().splitlines()[0]
    run_dir = tmp_path / "work" / "runs" / run_id
    assert (run_dir / "sbatch.sh").is_file() and not (run_dir / "submitit").exists()
    assert re.fullmatch(r"slurmlab-\d{8}-\d{6}-[0-9a-f]{4}", run_id)
    assert "COMPLETED (exit 0)" in result.stderr
    logs = fsdpctl(lab, slurm, tmp_path, "logs", run_id).stdout
    assert re.search(r"\[n1\] fsdpctl: node 0 of 2 on n1 ", logs), logs[-2000:]
    assert re.search(r"\[n2\] fsdpctl: node 1 of 2 on n2 ", logs), logs[-2000:]
    losses = [float(x) for x in re.findall(r"step=\d+ loss=([0-9.]+)", logs)]
    assert len(losses) >= 3 and losses[-1] < losses[0]
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--json").stdout)
    assert status["state"] == "succeeded" and status["job_id"]
    assert [n["host"] for n in status["nodes"]] == ["n1", "n2"]
    # where its seconds went: submitted, queued, each node's torchrun, rendezvous and lines, the end
    rows = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--timings", "--json").stdout)["timeline"]
    phases = [row["phase"] for row in rows]
    expected = ["startup", "plan", "submit", "queued", "torchrun", "rendezvous", "first_line", "first_step",
                "last_line", "exit", "logs"]
    assert phases == expected, rows
    by_phase = {row["phase"]: row for row in rows}
    assert by_phase["torchrun"]["nodes"] == 2 and by_phase["rendezvous"]["nodes"] == 2, rows
    done = [by_phase[p]["done"] for p in expected if p != "last_line"]
    assert all(b >= a - 0.05 for a, b in zip(done, done[1:], strict=False)), rows
    # the goodput account holds the nodes from the job's start: the submit and the queue shown apart
    counted = status["goodput"]
    assert counted["queued_s"] == pytest.approx(by_phase["queued"]["done"], abs=0.05), (counted, rows)
    seconds = counted["seconds"]
    assert sum(seconds.values()) == pytest.approx(counted["wall_s"], abs=0.01) and seconds["productive"] > 0
    assert seconds["unattributed"] <= 0.01 * counted["wall_s"], counted


@pytest.mark.parametrize("via", ["sbatch", "submitit"])
def test_dry_run_submits_nothing(lab, slurm, tmp_path, via):
    before = queue(slurm)
    result = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(profile(lab, tmp_path, 8)), "--dry-run",
                     "--via", via)
    assert result.returncode == 0 and "#SBATCH --nodes=2" in result.stdout
    if via == "submitit":  # the script submitit would write, with fsdpctl's setup lines in it
        assert "-m submitit.core._submit" in result.stdout and 'cd "$FSDPCTL_RUN_DIR"' in result.stdout
    assert queue(slurm) == before and not (tmp_path / "runs").exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("via", ["submitit"])  # sbatch's job: the interrupted follow's, below
def test_stop_mid_run_ends_every_process_on_both_nodes(lab, slurm, tmp_path, via):
    result = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(profile(lab, tmp_path, 5000)), "--via", via)
    assert result.returncode == 0, result.stderr[-2000:]
    run_id = result.stdout.strip()
    run_dir = next((tmp_path / "work" / "runs").glob(f"{run_id}"))
    wait_for_line(run_dir / "node0.log", r"step=\d+ loss=")
    assert processes_of(run_id, node_rank=0) and processes_of(run_id, node_rank=1)
    assert states_shown(lab, slurm, tmp_path, run_id) == ["running"] * 4  # Slurm's word, in every view
    stopped = fsdpctl(lab, slurm, tmp_path, "stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 30
    while processes_of(run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(run_id)
    assert states_shown(lab, slurm, tmp_path, run_id) == ["stopped"] * 4


def states_shown(lab, slurm, tmp_path: Path, run_id: str) -> list[str]:
    """The run's state as `runs` (its table and --json), `status --json` and run.json say it, in that order."""
    table = fsdpctl(lab, slurm, tmp_path, "runs").stdout.splitlines()
    row = next(line.split() for line in table if line.startswith(run_id))
    listed = next(r for r in json.loads(fsdpctl(lab, slurm, tmp_path, "runs", "--json").stdout)
                  if r["run_id"] == run_id)
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--json").stdout)
    recorded = json.loads((tmp_path / "runs" / run_id / "run.json").read_text())
    return [row[1], listed["state"], status["state"], recorded["state"]]


def test_a_job_sbatch_refuses_is_recorded_failed_with_sbatchs_reason(lab, slurm, tmp_path):
    path = profile(lab, tmp_path, 8)
    path.write_text(path.read_text().replace("  nodes: 2\n", "  nodes: 2\n  constraint: nosuchfeature\n"))
    result = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(path))
    assert result.returncode == 1 and "sbatch refused the job: " in result.stderr, result.stderr
    reason = result.stderr.split("sbatch refused the job: ")[1].splitlines()[0]
    assert "feature" in reason.lower(), reason  # Slurm's own words
    [run_id] = [p.name for p in (tmp_path / "runs").iterdir()]
    assert states_shown(lab, slurm, tmp_path, run_id) == ["failed"] * 4
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--json").stdout)
    assert status["nodes"] == [] and status.get("job_id") is None
    assert status["first_failure"]["kind"] == "refused" and reason in status["first_failure"]["refused"]
    said = fsdpctl(lab, slurm, tmp_path, "status", run_id)
    assert said.stdout.splitlines() == [f"{run_id}: failed", f"  first failure: sbatch refused the job: {reason}"]
    stop = fsdpctl(lab, slurm, tmp_path, "stop", run_id)
    assert stop.returncode == 2 and "nothing to stop" in stop.stderr and "no Slurm job" in stop.stderr, stop.stderr
    assert "squeue" not in stop.stderr and "None" not in stop.stderr
    assert states_shown(lab, slurm, tmp_path, run_id) == ["failed"] * 4  # stop left it as it was


# SIGHUP, the terminal closed: SIGINT and SIGTERM go through the same handler (backends/signals.py)
@pytest.mark.parametrize("signum", [signal.SIGHUP])
def test_an_interrupted_follow_says_the_job_goes_on_and_how_to_end_it(lab, slurm, tmp_path, signum):
    follower, run_dir = follow_submit(lab, slurm, tmp_path, "-p", str(profile(lab, tmp_path, 5000)))
    try:
        wait_for_line(run_dir / "node0.log", r"step=\d+ loss=")
        follower.send_signal(signum)  # `ip netns exec` has exec'd: this is fsdpctl itself
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 128 + signum, err[-2000:]
    job_id = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_dir.name, "--json").stdout)["job_id"]
    assert f"stopped following; Slurm job {job_id} goes on (end it with `fsdpctl stop {run_dir.name}` " \
           f"or `scancel {job_id}`)" in err
    assert "Traceback" not in err
    # the job is Slurm's: it went on, on both nodes, and every view says so
    assert job_id in queue(slurm) and processes_of(run_dir.name, node_rank=0) and processes_of(run_dir.name,
                                                                                               node_rank=1)
    assert states_shown(lab, slurm, tmp_path, run_dir.name) == ["running"] * 4  # Slurm's word, in every view
    stopped = fsdpctl(lab, slurm, tmp_path, "stop", run_dir.name)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 30
    while processes_of(run_dir.name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_of(run_dir.name)
    assert states_shown(lab, slurm, tmp_path, run_dir.name) == ["stopped"] * 4


# Without a spare, a failing rank's exit code, status and last lines on Slurm: the backend contract's
# test_a_failing_rank_gives_the_run_its_exit_code_and_is_named.
@pytest.mark.parametrize("spares", [1], ids=["a-spare-held"])
def test_a_failing_job_reports_failed_with_its_exit_code(lab, slurm, tmp_path, spares):
    bad = profile(lab, tmp_path, 8, extra_train="  dataset: /nonexistent/corpus\n")
    held = ("--spares", "1", "--partition", "spares") if spares else ()
    result = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(bad), "--follow", *held)
    assert result.returncode != 0
    assert "FAILED" in result.stderr, result.stderr[-2000:]
    run_id = result.stdout.strip().splitlines()[0]
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--json").stdout)
    assert status["state"] == "failed" and status["exit_code"] == result.returncode
    logs = fsdpctl(lab, slurm, tmp_path, "logs", run_id).stdout
    assert "/nonexistent/corpus" in logs
    if spares:  # a program error blames no node: the spare is never used, the job ends as without one
        events = [json.loads(line) for line in (tmp_path / "work" / "runs" / run_id / "slurm-steps.jsonl")
                  .read_text().splitlines()]
        assert [(e["event"], e.get("blamed")) for e in events] == [("step", None), ("failed", {})]
        assert "no node is to blame: a program error ends the job" in logs
        assert status["replacements"] == []


SPARE_STEPS = 40


def spare_profile(lab, tmp_path: Path) -> Path:
    """A 2-node job of SPARE_STEPS steps that saves a checkpoint every 10."""
    return profile(lab, tmp_path, SPARE_STEPS, extra_train="  checkpoint_interval: 10\n")


@pytest.fixture(scope="module")
def uninterrupted(lab, slurm, tmp_path_factory) -> float:
    """The final loss of the same 2-node job run without a node lost (the loss a spare or a shrink keeps)."""
    tmp_path = tmp_path_factory.mktemp("uninterrupted")
    reference = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(spare_profile(lab, tmp_path)), "--follow")
    assert reference.returncode == 0, reference.stderr[-2000:]
    return final_loss(tmp_path / "work" / "runs" / reference.stdout.strip().splitlines()[0])


def lose_node_1(slurm, run_dir: Path, follower: subprocess.Popen) -> tuple[str, str]:
    """Once node 0 logged step 14: kill n2's slurmd and its ranks, as when the node dies; the
    follower's output once the job ended."""
    try:
        wait_for_line(run_dir / "node0.log", r"step=14 loss=")
        ranks = [pid for pid in processes_of(run_dir.name, node_rank=1)
                 if b"fsdpctl.workload.train" in Path(f"/proc/{pid}/cmdline").read_bytes()
                 and b"torch.distributed.run" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert ranks
        slurm.kill_slurmd("n2")
        for pid in ranks:
            os.kill(pid, signal.SIGKILL)
        return follower.communicate(timeout=300)
    finally:
        if follower.poll() is None:
            follower.kill()
        slurm.start_slurmd("n2")


def test_a_node_lost_mid_job_is_replaced_by_a_held_spare_and_the_job_finishes_with_the_same_loss(
        lab, slurm, tmp_path, uninterrupted):
    """n1 and n2 train, n3 is held; n2's slurmd and ranks are killed; the next step runs on n1 and
    n3 in the same allocation, from the newest checkpoint, and ends with an uninterrupted run's loss."""
    path = spare_profile(lab, tmp_path)
    path.write_text(path.read_text().replace("  nodes: 2\n", "  nodes: 2\n  spares: 1\n  partition: spares\n"))
    follower, run_dir = follow_submit(lab, slurm, tmp_path, "-p", str(path))
    out, err = lose_node_1(slurm, run_dir, follower)
    print(f"\n--- submit --follow with a spare ---\n{err[-4000:]}")
    assert follower.returncode == 0, err[-4000:]
    assert "n3 replaces n2 as node 1 for step 2 (failed the re-check: " in out + err
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_dir.name, "--json").stdout)
    assert status["state"] == "succeeded"
    assert [(n["host"], n["ranks"]) for n in status["nodes"]] == [("n1", "0"), ("n3", "1")]
    [replaced] = status["replacements"]
    assert (replaced["host"], replaced["by"]) == ("n2", "n3") and "re-check" in replaced["why"]
    events = [json.loads(line) for line in (run_dir / "slurm-steps.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["step", "failed", "replaced", "step", "succeeded"]
    failed, again = events[1], events[2]
    assert list(failed["blamed"]) == ["n2"] and again["hosts"] == ["n1", "n3"] and again["from_step"] % 10 == 0
    redone = failed["last_step"] - again["from_step"]  # trained again: from the checkpoint to the last step seen
    assert status["recovery"]["steps_redone"] == redone and status["recovery"]["stood_still_s"] > 0
    said = fsdpctl(lab, slurm, tmp_path, "status", run_dir.name).stdout
    assert "n3 in the place of n2 (failed the re-check" in said and f"{redone} step(s) done again" in said
    steps = train_steps(run_dir)
    assert steps[-1] == SPARE_STEPS and set(range(2, SPARE_STEPS + 1, 2)) <= set(steps)
    assert final_loss(run_dir) == uninterrupted


def test_a_node_lost_mid_job_with_no_spare_shrinks_an_elastic_job_to_the_node_left_with_the_same_loss(
        lab, slurm, tmp_path, uninterrupted):
    """n1 and n2 train, no spare is held, --min-nodes 1; n2's slurmd and ranks are killed; the next
    step runs on n1 alone in the same allocation, from the newest checkpoint, keeping the global
    batch by accumulation, and ends with (nearly) an uninterrupted 2-node run's loss."""
    follower, run_dir = follow_submit(lab, slurm, tmp_path, "-p", str(spare_profile(lab, tmp_path)),
                                      "--min-nodes", "1")
    out, err = lose_node_1(slurm, run_dir, follower)
    print(f"\n--- submit --follow --min-nodes 1 ---\n{err[-4000:]}")
    assert follower.returncode == 0, err[-4000:]
    assert ("step 2 runs on 1 of 2 nodes: n2 out (failed the re-check: " in out + err
            and "it continues from the newest checkpoint (min_nodes 1)" in out + err)
    events = [json.loads(line) for line in (run_dir / "slurm-steps.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["step", "failed", "shrunk", "step", "succeeded"]
    failed, shrunk = events[1], events[2]
    assert list(failed["blamed"]) == ["n2"] and shrunk["from_step"] % 10 == 0
    assert (shrunk["hosts"], shrunk["out"], shrunk["nodes"], shrunk["before"], shrunk["full"]) == (
        ["n1"], ["n2"], 1, 2, 2)
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_dir.name, "--json").stdout)
    assert status["state"] == "succeeded" and [(n["host"], n["ranks"]) for n in status["nodes"]] == [("n1", "0")]
    assert status["resize"]["batch"] == "global batch 8 kept: batch 4 x accumulation 2 per rank"
    redone = failed["last_step"] - shrunk["from_step"]
    assert status["recovery"]["steps_redone"] == redone and status["recovery"]["stood_still_s"] > 0
    said = fsdpctl(lab, slurm, tmp_path, "status", run_dir.name).stdout
    assert "runs on 1 of 2 nodes: n2 out (failed the re-check" in said and f"{redone} step(s) done again" in said
    assert "step 2, node count changed 1 time(s)" in (run_dir / "node0.log").read_text()  # the ranks were told
    steps = train_steps(run_dir)
    assert steps[-1] == SPARE_STEPS and set(range(2, SPARE_STEPS + 1, 2)) <= set(steps)
    print(f"final loss: shrunk to 1 node {final_loss(run_dir)}, uninterrupted on 2 nodes {uninterrupted}")
    assert final_loss(run_dir) == pytest.approx(uninterrupted, rel=0.005)


def final_loss(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if row["kind"] == "train"][-1]


REQUEUE_STEPS = 60


def train_steps(run_dir: Path) -> list[int]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if row["kind"] == "train"]


def submit_requeueable(lab, slurm, tmp_path: Path, via: str = "sbatch") -> tuple[str, str, Path]:
    """A 2-node job with --requeue, running past step 10; returns run id, job id and run directory."""
    result = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(profile(lab, tmp_path, REQUEUE_STEPS)),
                     "--requeue", "--set", "log_interval=1", "--via", via)
    assert result.returncode == 0, result.stderr[-2000:]
    run_id = result.stdout.strip()
    job_id = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--json").stdout)["job_id"]
    run_dir = tmp_path / "work" / "runs" / run_id
    wait_for_line(run_dir / "node0.log", r"step=1\d loss=")
    return run_id, job_id, run_dir


def finish_and_check_exact(lab, slurm, tmp_path: Path, run_id: str, run_dir: Path, signal_name: str) -> int:
    """Follow the requeued job to its end; every step ran exactly once across the two attempts."""
    followed = fsdpctl(lab, slurm, tmp_path, "logs", "-f", run_id)
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--json").stdout)
    assert status["state"] == "succeeded", followed.stdout[-3000:] + followed.stderr[-2000:]
    node0 = (run_dir / "node0.log").read_text()
    stopped = re.search(rf"{signal_name}\S* received: stopped after step (\d+), checkpoint step_(\d+)", node0)
    assert stopped, node0[-3000:]
    step = int(stopped.group(1))
    assert 10 <= step < REQUEUE_STEPS and int(stopped.group(2)) == step
    assert "Slurm start 2" in node0 and f"resumed_from=step_{step:07d}" in node0
    assert train_steps(run_dir) == list(range(1, REQUEUE_STEPS + 1))
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == REQUEUE_STEPS
    return step


@pytest.mark.parametrize("via", ["sbatch", "submitit"])
def test_usr2_before_the_time_limit_checkpoints_requeues_and_finishes_the_exact_steps(lab, slurm, tmp_path, via):
    run_id, job_id, run_dir = submit_requeueable(lab, slurm, tmp_path, via)
    # What Slurm sends signal_seconds before the time limit (--signal=USR2@120), sent now.
    subprocess.run(slurm.client(["scancel", "--signal=USR2", job_id]), check=True, timeout=30)
    finish_and_check_exact(lab, slurm, tmp_path, run_id, run_dir, "SIGUSR2")
    if via == "sbatch":
        assert "requeueing it" in (run_dir / f"slurm-{job_id}.out").read_text()
    else:  # submitit's task 0 waited for the checkpoint, then requeued
        assert f"Requeued job {job_id}" in (run_dir / "submitit" / f"{job_id}_0_log.out").read_text()


def test_scontrol_requeue_mid_run_resumes_from_the_checkpoint_and_finishes_the_exact_steps(lab, slurm, tmp_path):
    run_id, job_id, run_dir = submit_requeueable(lab, slurm, tmp_path)
    subprocess.run(slurm.client(["scontrol", "requeue", job_id]), check=True, timeout=30)
    finish_and_check_exact(lab, slurm, tmp_path, run_id, run_dir, "SIGTERM")


def doctor(lab, slurm, tmp_path: Path, path: Path) -> tuple[int, dict]:
    result = fsdpctl(lab, slurm, tmp_path, "doctor", "-p", str(path), "--json", timeout=120)
    assert result.stdout.strip(), result.stderr[-2000:]
    return result.returncode, json.loads(result.stdout)


def test_doctor_on_a_slurm_profile_checks_the_cluster_and_probes_allocated_nodes(lab, slurm, tmp_path):
    code, report = doctor(lab, slurm, tmp_path, profile(lab, tmp_path, 8))
    assert code == 0 and report["ok"], json.dumps(report, indent=1)[-3000:]
    checks = {c["name"]: c for c in report["cluster"]}
    assert checks["controller"]["status"] == "pass" and "UP" in checks["controller"]["detail"]
    assert checks["partition"]["detail"] == "debug: up, 2 node(s), 2 idle, 2 needed"
    assert checks["allocation"]["status"] == "pass"
    assert sorted(h["host"] for h in report["hosts"]) == ["n1", "n2"]  # probed on the nodes themselves
    for host in report["hosts"]:
        by_name = {c["name"]: c for c in host["checks"]}
        assert by_name["storage"]["status"] == "pass" and by_name["interface"]["status"] == "pass"
        assert by_name["port"]["status"] == "pass"  # node 1 reached node 0's rendezvous port
    assert {p["fact"]: p["status"] for p in report["parity"]}["torch"] == "pass"
    assert not list((tmp_path / "work").glob(".fsdpctl-doctor-*"))  # its marker file is gone again
    assert "fsdpctl-doctor" not in queue(slurm)
    shown = fsdpctl(lab, slurm, tmp_path, "doctor", "-p", str(profile(lab, tmp_path, 8)))
    assert shown.returncode == 0 and "ok slurm controller: Slurmctld(primary) at n1 is UP" in shown.stdout


def test_doctor_names_a_missing_partition_and_too_many_nodes(lab, slurm, tmp_path):
    path = profile(lab, tmp_path, 8)
    path.write_text(path.read_text().replace("  nodes: 2\n", "  nodes: 2\n  partition: gpu\n"))
    code, report = doctor(lab, slurm, tmp_path, path)
    assert code == 1
    assert [c["detail"] for c in report["cluster"] if c["name"] == "partition"] == [
        "partition gpu does not exist (has: debug, spares)"]
    assert report["hosts"] == []
    path.write_text(path.read_text().replace("  partition: gpu\n", "").replace("  nodes: 2\n", "  nodes: 3\n"))
    code, report = doctor(lab, slurm, tmp_path, path)
    partition = next(c for c in report["cluster"] if c["name"] == "partition")
    assert code == 1 and partition["status"] == "fail" and "3 needed" in partition["detail"]


def test_a_batch_script_that_fails_before_any_node_starts_shows_its_own_output(lab, slurm, tmp_path):
    path = profile(lab, tmp_path, 8)
    path.write_text(path.read_text() + "setup:\n  - module load cuda/99.9\n")  # no `module` on these nodes
    result = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "-p", str(path), "--follow")
    assert result.returncode == 127, result.stderr[-2000:]
    assert "ended FAILED; the end of the batch output" in result.stderr
    assert "module: command not found" in result.stderr
    shown = fsdpctl(lab, slurm, tmp_path, "logs", result.stdout.strip().splitlines()[0])
    assert "no node has written a log yet" in shown.stderr and "module: command not found" in shown.stderr


def test_doctor_collectives_through_slurm(lab, slurm, tmp_path):
    result = fsdpctl(lab, slurm, tmp_path, "doctor", "-p", str(profile(lab, tmp_path, 8)), "--collectives", "--json")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(result.stdout)["collectives"]
    assert data["backend"] == "gloo" and data["world_size"] == 2 and data["transport"] == ["gloo/TCP"]
    assert {row["op"] for row in data["results"]} == {"all_reduce", "all_gather"}
    assert all(row["busbw_gbps"] > 0 for row in data["results"])
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", data["run_id"], "--json").stdout)
    assert status["state"] == "succeeded" and [n["host"] for n in status["nodes"]] == ["n1", "n2"]
    assert "fsdpctl-" not in queue(slurm)


@pytest.mark.parametrize("via", ["sbatch", "submitit"])
def test_a_user_project_through_slurm_gets_its_arguments_and_a_secret_in_no_file(lab, slurm, tmp_path, via):
    import hashlib

    from tests.integration.test_secrets import SECRET, leaks, readable_by_others
    from tests.integration.user_project import write_project

    project = write_project(tmp_path / "project")
    env = {**os.environ, **slurm.env, "HOME": str(tmp_path), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"),
           "PYTHONPATH": str(REPO), "USER_SECRET": SECRET}
    result = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", "submit", "--slurm", "-p",
                                           str(profile(lab, tmp_path, 8)), "--via", via, "--code", str(project),
                                           "--env", "USER_SECRET", "--env", "PRINT_SECRET=1", "--follow",
                                           "--", "-m", "proj.train", "two words", "$(touch PWNED)"]),
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    run_id = result.stdout.strip().splitlines()[0]
    run_dir = tmp_path / "work" / "runs" / run_id
    assert "COMPLETED (exit 0)" in result.stderr
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_id, "--json").stdout)
    assert status["state"] == "succeeded" and status["job_id"] and [n["host"] for n in status["nodes"]] == ["n1", "n2"]
    if via == "submitit":  # submitit's own batch script, in the run's own folder
        assert "submitit.core._submit" in next((run_dir / "submitit").glob("*_submission.sh")).read_text()
    else:
        assert (run_dir / "sbatch.sh").is_file() and not (run_dir / "submitit").exists()
    out = {p.name: json.loads(p.read_text()) for p in (run_dir / "out").glob("rank*.json")}
    assert sorted(out) == ["rank0.json", "rank1.json"] and {r["host"] for r in out.values()} == {"n1", "n2"}
    assert all(r["argv"] == ["two words", "$(touch PWNED)"] and r["cwd"] == str(run_dir / "code")
               for r in out.values())
    assert not (run_dir / "code" / "data").exists() and not list(tmp_path.rglob("PWNED"))
    assert {r["secret_sha256"] for r in out.values()} == {hashlib.sha256(SECRET.encode()).hexdigest()}
    assert "the secret is: ***" in result.stdout and "zq8" not in result.stdout + result.stderr
    logs = fsdpctl(lab, slurm, tmp_path, "logs", run_id).stdout
    assert "[n1 r0] user step=4 loss=" in logs and "the secret is: ***" in logs
    assert leaks(run_dir, tmp_path / "runs") == []  # the batch script, submitit's files, every log
    assert readable_by_others(run_dir, tmp_path / "runs") == []


def test_stacks_and_the_hang_watchdog_on_a_slurm_job(lab, slurm, tmp_path):
    """`fsdpctl stacks` goes into the job with `srun --overlap` (one task per node); a hang that
    `submit --follow` sees is cancelled with its stacks and flight-recorder dumps kept. The watchdog
    waits 45 s: with 20, a loaded CI machine's `stacks` (an srun step, py-spy on four ranks) was still
    running when the watchdog cancelled the job, and Slurm ended the step with it."""
    from tests.integration.user_project import write_project

    project = write_project(tmp_path / "project")
    follower, run_dir = follow_submit(
        lab, slurm, tmp_path, "-p", str(profile(lab, tmp_path, 8)), "--nproc-per-node", "2", "--code", str(project),
        "--env", "STEPS=1000", "--env", "HANG_RANK=3", "--env", "STEP_SLEEP=0.2", "--hang-timeout", "45", "--",
        "train.py")
    try:
        wait_for_line(run_dir / "node0.log", r"user step=2 ")
        time.sleep(2)
        shown = fsdpctl(lab, slurm, tmp_path, "stacks", run_dir.name)
        print(f"\n--- fsdpctl stacks (Slurm) ---\n{shown.stdout}")
        assert shown.returncode == 0, shown.stderr[-2000:]
        blocks = shown.stdout.split("\n\n")[1:]
        assert blocks[0].startswith("rank 3 on n2  (1 of 4) - the odd one out"), shown.stdout
        assert "in wait_for_a_lock_that_never_frees" in blocks[0]
        assert blocks[1].startswith("ranks 0-2 on n1,n2  (3 of 4)"), shown.stdout
        out, err = follower.communicate(timeout=120)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 124, err[-3000:]
    assert "rank 3 on n2 stands apart" in err and (tmp_path / "runs" / run_dir.name / "hang" / "stacks.json").is_file()
    status = json.loads(fsdpctl(lab, slurm, tmp_path, "status", run_dir.name, "--json").stdout)
    assert status["state"] == "failed" and status["exit_code"] == 124 and status["first_failure"]["rank"] == 3
    deadline = time.monotonic() + 30
    while (processes_of(run_dir.name) or status["job_id"] in queue(slurm)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_of(run_dir.name) and status["job_id"] not in queue(slurm)


def test_submit_resume_continues_a_cancelled_job_from_its_checkpoint(lab, slurm, tmp_path):
    path = profile(lab, tmp_path, 40, extra_train="  checkpoint_interval: 10\n")
    follower, run_dir = follow_submit(lab, slurm, tmp_path, "-p", str(path), "--set", "log_interval=1",
                                      "--batch-size", "8", "--set", "seq_len=128")
    try:
        wait_for_line(run_dir / "node0.log", r"step=1[3-9] loss=")
        stopped = fsdpctl(lab, slurm, tmp_path, "stop", run_dir.name)
        assert stopped.returncode == 0, stopped.stderr
        follower.communicate(timeout=60)
    finally:
        follower.kill()
    # scancel --signal: every rank saved the step it stood at (as over SSH), then the job was cancelled
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    from_step = int(saved[-1].split("_")[1])
    assert 13 <= from_step < 20, saved
    assert f"stopped after its checkpoint of step {from_step}" in stopped.stderr, stopped.stderr
    resumed = fsdpctl(lab, slurm, tmp_path, "submit", "--slurm", "--resume", run_dir.name, "--follow")
    print(f"\n--- submit --slurm --resume ---\n{resumed.stderr[-1500:]}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.splitlines()[0] == run_dir.name  # the id first, as submit prints it
    assert f"fsdpctl: run {run_dir.name}: attempt 2 from step {from_step}" in resumed.stderr
    node0 = (run_dir / "node0.log").read_text()
    assert f"resumed_from=step_{from_step:07d}" in node0 and "step=40 loss=" in node0
    assert "loss=" not in node0.split("resumed_from")[0]  # the first attempt's lines are in attempts/1
    assert "step=13 loss=" in (run_dir / "attempts" / "1" / "node0.log").read_text()
    assert train_steps(run_dir) == list(range(1, 41))
    record = json.loads((tmp_path / "runs" / run_dir.name / "run.json").read_text())
    assert record["attempt"] == 2 and record["state"] == "succeeded"
    assert len(record["attempts"]) == 1 and record["attempts"][0]["state"] in ("stopped", "cancelled")
    earlier = fsdpctl(lab, slurm, tmp_path, "logs", run_dir.name, "--attempt", "1")
    assert "step=13 loss=" in earlier.stdout and "resumed_from" not in earlier.stdout


def test_init_from_a_slurm_nodelist_writes_a_profile_doctor_passes(lab, slurm, tmp_path):
    result = fsdpctl(lab, slurm, tmp_path, "init", "slurminit", "--slurm", "--nodelist", "n[1-2]", "--python",
                     sys.executable, "--workdir", f"{tmp_path}/work")
    print(f"\n--- fsdpctl init --slurm ---\n{result.stderr}\n{result.stdout}")
    assert result.returncode == 0, result.stderr[-3000:]
    data = yaml.safe_load(result.stdout)
    assert data["backend"] == "slurm" and data["slurm"] == {"nodes": 2}
    assert data["network"] == {"interface": "eth0", "ib": False} and data["device"] == "cpu"
    assert "n1: eth0" in result.stdout and "n2: eth0" in result.stdout  # probed on the nodes, through srun
    assert "fsdpctl-doctor" not in queue(slurm)
    code, report = doctor(lab, slurm, tmp_path, tmp_path / "cluster_profiles" / "slurminit.yaml")
    assert code == 0 and report["ok"], json.dumps(report, indent=1)[-3000:]
