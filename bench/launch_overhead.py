"""Launch overhead on the 2-host namespace testbed: time to the first training step.

  A: `fsdpctl launch -p lab` from the client namespace (preflight, staging over SSH, start, stream)
  B (baseline): the same node scripts (the torchrun lines a user would type) started by hand in each
     host's namespace at once, no SSH
Both measured from the start of the command(s) to rank 0's first `step=` line, interleaved A B A B.
Goal: A/B <= 1.2. Run as root: .venv/bin/python bench/launch_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, summarize  # noqa: E402

from tests.testbed.lab import Lab, netns_available  # noqa: E402

TRAIN = ("train:\n  preset: tiny\n  steps: 3\n  batch_size: 4\n  seq_len: 64\n  log_interval: 1\n"
         "  eval_interval: 0\n  eval_steps: 1\n  vocab_size: 2000\n  no_checkpoint: true\n")


def first_step(processes: list[subprocess.Popen], started: float, timeout: float = 300) -> float:
    """Seconds until any process prints a `step=` line; then wait for all to finish."""
    found = None
    deadline = time.monotonic() + timeout
    stream = processes[0].stdout
    assert stream is not None
    for raw in stream:
        if "step=" in raw and found is None:
            found = time.perf_counter() - started
        if time.monotonic() > deadline:
            break
    for process in processes:
        if process.wait(timeout=timeout) != 0:
            raise SystemExit(f"a run failed (exit {process.returncode})")
    if found is None:
        raise SystemExit("no training step was printed")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reason = netns_available()
    if reason:
        sys.exit(f"launch_overhead: the namespace testbed {reason}")
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-launch-"))
    lab = Lab(root, ["n1", "n2"]).up()
    try:
        for name in lab.names:
            lab.start_sshd(name)
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable) + TRAIN)
        env = {**os.environ, "HOME": str(root), "FSDPCTL_RUNS_DIR": str(root / "runs"), "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)
        fsdpctl = [sys.executable, "-m", "fsdpctl"]

        def by_fsdpctl(*extra: str) -> float:
            started = time.perf_counter()
            process = subprocess.Popen(lab.in_client([*fsdpctl, "launch", "-p", str(profile), *extra]), env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            return first_step([process], started)

        def ssh_exec() -> float:
            started = time.perf_counter()
            subprocess.run(lab.in_client(["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes",
                                          "-o", f"UserKnownHostsFile={lab.known_hosts}",
                                          f"root@{lab.hosts['n1'].address}", "true"]), env=env, check=True,
                           capture_output=True)
            return time.perf_counter() - started

        def by_hand() -> float:
            out = root / f"rendered-{time.monotonic_ns()}"
            subprocess.run([*fsdpctl, "render", "-p", str(profile), "--out", str(out)], env=env, check=True,
                           capture_output=True)
            # What a user would have typed: the workload shipped by hand once, then one line per host.
            run_dir = Path(__import__("json").loads((out / "plan.json").read_text())["run_dir"])
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "pkg").symlink_to(REPO, target_is_directory=True)
            started = time.perf_counter()
            processes = [subprocess.Popen(
                ["ip", "netns", "exec", lab.hosts[name].namespace, "unshare", "--uts", "sh", "-c",
                 f'hostname {name} && exec bash {out}/node{rank}.sh'], env=env, text=True,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=subprocess.STDOUT)
                for rank, name in enumerate(["n1", "n2"])]
            return first_step(processes, started)

        by_fsdpctl()  # warm the tokenizer cache and the page cache
        samples = interleaved({"fsdpctl launch": by_fsdpctl,
                               "fsdpctl launch --no-preflight": lambda: by_fsdpctl("--no-preflight"),
                               "hand-typed torchrun per host": by_hand},
                              repeats=args.repeats, warmup=0)
        # What one SSH command costs on these hosts (connection + the login shell's rc files):
        # launch needs two before the nodes start (preflight, stage+start), --no-preflight one.
        exec_cost = sorted(ssh_exec() for _ in range(5))[2]
        report("launch_overhead", "hand-typed torchrun per host",
               summarize(samples, "hand-typed torchrun per host"),
               {"goal": "fsdpctl launch ratio <= 1.2", "ssh_exec_seconds": exec_cost})
        print(f"one `ssh host true` on this testbed: {exec_cost:.3f} s")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
