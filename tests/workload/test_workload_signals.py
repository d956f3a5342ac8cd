"""Stop on a scheduler's signal: the ranks agree on the step, save it, and a rerun with
--resume-if-present continues to exactly the asked number of steps, with the same losses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fsdpctl.workload.config import ConfigError, make_config
from tests.workload.conftest import ADAMW, BASE_FLAGS, REPO, child_env, torchrun_cmd

pytestmark = pytest.mark.workload

FLAGS = [*ADAMW, "--fsdp", "2", "--checkpoint-on-signal"]


def workers_of(torchrun_pid: int) -> dict[int, int]:
    """torchrun's worker processes, by global rank (from each one's environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != torchrun_pid:
                continue
            env = dict(item.split("=", 1) for item in (entry / "environ").read_text().split("\0") if "=" in item)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = int(entry.name)
    return found


def steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [row["step"] for row in rows if row["kind"] == "train"]


def start(trainer, run_dir: Path, *flags: str, flags_of_run=FLAGS, env=None) -> subprocess.Popen:
    argv = [*BASE_FLAGS, "--cache-dir", str(trainer.cache_dir), "--run-dir", str(run_dir), *flags_of_run, *flags]
    run_dir.mkdir(parents=True, exist_ok=True)
    out = (run_dir / "out.txt").open("w")
    return subprocess.Popen([*torchrun_cmd(2), *argv], cwd=REPO, env={**child_env(run_dir), **(env or {})},
                            stdout=out, stderr=subprocess.STDOUT)


def signal_one_rank_mid_run(proc: subprocess.Popen, run_dir: Path, signum: int) -> None:
    """Freeze rank 0 once it has logged step 3 (every rank then waits in its next collective), send
    ``signum`` to rank 1 only, then let rank 0 go: only agreement can stop rank 0."""
    deadline = time.monotonic() + 120
    while len(steps_logged(run_dir)) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, (run_dir / "out.txt").read_text()[-3000:]
        time.sleep(0.005)
    workers = workers_of(proc.pid)
    assert sorted(workers) == [0, 1]
    os.kill(workers[0], signal.SIGSTOP)
    try:
        assert steps_logged(run_dir)[-1] < 20, "the run ended before the signal; it cannot test anything"
        os.kill(workers[1], signum)
        time.sleep(0.3)
    finally:
        os.kill(workers[0], signal.SIGCONT)


def test_usr2_on_one_rank_saves_the_same_step_everywhere_and_resume_is_exact(adamw_runs, trainer, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(trainer, run_dir)
    signal_one_rank_mid_run(proc, run_dir, signal.SIGUSR2)
    assert proc.wait(timeout=120) == 0, (run_dir / "out.txt").read_text()[-3000:]
    stopped = steps_logged(run_dir)[-1]
    assert 3 <= stopped < 20
    marker = json.loads((run_dir / "requeue-requested").read_text())
    assert marker == {"step": stopped, "checkpoint": f"step_{stopped:07d}"}
    out = (run_dir / "out.txt").read_text()
    assert f"SIGUSR2 received: stopped after step {stopped}" in out
    assert not (run_dir / "summary.json").exists()

    proc = start(trainer, run_dir, "--resume-if-present")
    assert proc.wait(timeout=120) == 0, (run_dir / "out.txt").read_text()[-3000:]
    assert f"resumed_from=step_{stopped:07d}" in (run_dir / "out.txt").read_text()
    assert steps_logged(run_dir) == list(range(1, 21))  # every step exactly once across the two runs
    straight = adamw_runs["fsdp2"].losses()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"]: r["loss"] for r in rows if r["kind"] == "train"} == straight  # bit-identical
    assert not (run_dir / "requeue-requested").exists()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 20


def test_sigterm_saves_and_exits_as_terminated_without_requeue(trainer, tmp_path):
    run_dir = tmp_path / "run"
    proc = start(trainer, run_dir)
    signal_one_rank_mid_run(proc, run_dir, signal.SIGTERM)
    assert proc.wait(timeout=120) != 0  # torchrun reports the workers' 143
    stopped = steps_logged(run_dir)[-1]
    assert (run_dir / "checkpoints" / f"step_{stopped:07d}" / ".metadata").is_file()
    assert not (run_dir / "requeue-requested").exists()
    assert "SIGTERM received: stopped after step" in (run_dir / "out.txt").read_text()


def test_under_fsdpctl_a_signal_it_did_not_ask_for_ends_the_rank_at_once_without_a_save(trainer, tmp_path):
    """Launched by fsdpctl (``FSDPCTL_STOP_SIGNAL``), the ranks save on a stop only when fsdpctl marked it
    asked for (``fsdpctl stop``, the launcher's Ctrl-C or SIGTERM: the integration tests); a SIGTERM
    without the mark (a hang or a failed peer being ended, a stop to grow) ends the rank at once, as
    it did before the ranks had a handler for it."""
    run_dir = tmp_path / "run"
    proc = start(trainer, run_dir, flags_of_run=[*ADAMW, "--fsdp", "2"], env={"FSDPCTL_STOP_SIGNAL": "SIGUSR1"})
    signal_one_rank_mid_run(proc, run_dir, signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    out = (run_dir / "out.txt").read_text()
    assert "received: stopped after step" not in out and not list(run_dir.glob("checkpoints/step_*")), out[-3000:]


def test_resume_if_present_starts_afresh_in_an_empty_run_dir(trainer, tmp_path):
    result = trainer(tmp_path / "fresh", "--steps", "2", "--eval-interval", "0", "--resume-if-present")
    assert "fresh" in result.stdout and sorted(result.losses()) == [1, 2]


def test_checkpoint_on_signal_needs_checkpoints():
    with pytest.raises(ConfigError, match="checkpoint_on_signal: cannot save with --no-checkpoint"):
        make_config({"checkpoint_on_signal": True, "no_checkpoint": True})
