"""Restart cost on the 2-host namespace testbed: from a rank's death to the first step of the next attempt.

  A: `fsdpctl launch --max-restarts 1`; rank 1 (on n2) is killed with SIGKILL after step 6, the newest
     checkpoint being step 5's; timed from the kill to the first `step=` line of attempt 2
  B (baseline): the same run started fresh by hand: its node scripts (the torchrun lines a user would
     type) started in each host's namespace at once, no SSH; timed to the first `step=` line
Interleaved; A is also split into where its time goes, from the launcher's own lines:
  detect + tear down   the kill -> fsdpctl's FAILED line (torchrun notices, the other node is stopped,
                       the logs are collected)
  decide               -> the "attempt 2 of 2" line (flight-recorder dumps looked for, the newest
                       checkpoint found on node 0)
  re-check + start     -> "attempt 2 started" (the preflight again, staging and starting both nodes)
  to the first step    -> the first `step=` line (torchrun's rendezvous, imports, the data, the model,
                       loading the checkpoint, one step)
Run as root: .venv/bin/python bench/restart.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fsdpctl_env, interleaved, report, start_lab, summarize  # noqa: E402
from launch_overhead import first_step  # noqa: E402

TRAIN = ("train:\n  preset: tiny\n  steps: 14\n  batch_size: 16\n  seq_len: 128\n  log_interval: 1\n"
         "  eval_interval: 0\n  eval_steps: 1\n  vocab_size: 2000\n  checkpoint_interval: 5\n")
PHASES = ("detect + tear down", "decide", "re-check + start", "to the first step")


class Lines:
    """A process's output lines, each with the time it arrived."""

    def __init__(self, process: subprocess.Popen):
        self.seen: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            with self.lock:
                self.seen.append((time.perf_counter(), raw.rstrip("\n")))

    def wait_for(self, pattern: str, after: float = 0.0, timeout: float = 300) -> float:
        """When the first line at or after ``after`` matching ``pattern`` (a regular expression) came."""
        return self.wait_for_match(pattern, after, timeout)[0]

    def wait_for_match(self, pattern: str, after: float = 0.0, timeout: float = 300) -> tuple[float, re.Match]:
        """``wait_for``, with the match (to read what the line said)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for at, line in self.seen:
                    if at >= after and (found := re.search(pattern, line)):
                        return at, found
            time.sleep(0.01)
        raise SystemExit(f"{pattern!r} never came; last lines: {[line for _, line in self.seen[-20:]]}")


def rank_1_worker(run_id: str) -> int:
    """The workload process of rank 1 (all namespaces share this machine's PIDs)."""
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if (f"FSDPCTL_RUN_ID={run_id}".encode() in env and b"RANK=1" in env and b"fsdpctl.workload.train" in cmdline
                and b"torch.distributed.run" not in cmdline):
            return int(proc.name)
    raise SystemExit("rank 1's worker was not found")


def fresh_by_hand(root: Path, lab, profile: Path, names: list[str], env: dict[str, str]) -> float:
    """A run of ``profile`` started fresh by hand: its node scripts (the torchrun lines a user would
    type) started in each host's namespace at once, no SSH; seconds to the first `step=` line."""
    out = root / f"rendered-{time.monotonic_ns()}"
    subprocess.run([sys.executable, "-m", "fsdpctl", "render", "-p", str(profile), "--out", str(out)], env=env,
                   check=True, capture_output=True)
    run_dir = Path(json.loads((out / "plan.json").read_text())["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pkg").symlink_to(REPO, target_is_directory=True)  # put in place once, by hand (not timed)
    started = time.perf_counter()
    processes = [subprocess.Popen(
        ["ip", "netns", "exec", lab.hosts[name].namespace, "unshare", "--uts", "sh", "-c",
         f"hostname {name} && exec bash {out}/node{rank}.sh"], env=env, text=True,
        stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for rank, name in enumerate(names)]
    return first_step(processes, started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root, lab = start_lab("restart")
    try:
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable) + TRAIN)
        env = fsdpctl_env(root)
        fsdpctl = [sys.executable, "-m", "fsdpctl"]
        phases: dict[str, list[float]] = {name: [] for name in PHASES}

        def restarted() -> float:
            before = set((root / "runs").glob("*")) if (root / "runs").exists() else set()
            process = subprocess.Popen(lab.in_client([*fsdpctl, "launch", "-p", str(profile), "--max-restarts", "1"]),
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            lines = Lines(process)
            lines.wait_for(r"step=6 loss=")
            run_dir = next(iter(set((root / "runs").glob("*")) - before))
            os.kill(rank_1_worker(run_dir.name), signal.SIGKILL)
            killed = time.perf_counter()
            failed = lines.wait_for(r"^fsdpctl: run \S+ FAILED:", killed)
            decided = lines.wait_for(r"^fsdpctl: attempt 2 of 2 from step 5 ", killed)
            started = lines.wait_for(r"^fsdpctl: run \S+ attempt 2 started", killed)
            first = lines.wait_for(r"step=6 loss=", started)
            if process.wait(timeout=300) != 0:
                raise SystemExit(f"the restarted run failed (exit {process.returncode})")
            for name, seconds in zip(PHASES, (failed - killed, decided - failed, started - decided, first - started),
                                     strict=True):
                phases[name].append(seconds)
            return first - killed

        def by_hand() -> float:
            return fresh_by_hand(root, lab, profile, ["n1", "n2"], env)

        baseline = "the same run started fresh by hand"
        samples = interleaved({"fsdpctl: rank killed -> first step of attempt 2": restarted, baseline: by_hand},
                              repeats=args.repeats, warmup=1)
        for values in phases.values():
            del values[0]  # the warm-up's
        where = {name: statistics.median(values) for name, values in phases.items()}
        report("restart", baseline, summarize(samples, baseline),
               {"goal": "report the ratio and where the time goes", "phases_median_s": where,
                "phases_s": phases})
        for name, seconds in where.items():
            print(f"  {name:20s} {seconds:6.2f} s")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
