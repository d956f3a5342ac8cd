"""What watching over the nodes costs, on the 2-host namespace testbed.

  Time to the first training step of a foreground `fsdpctl launch` (bundled workload, 3 steps):
    A: this tree (node agents stay on: heartbeats both ways, the log on the agent's stream)
    B (baseline): the same command from the last tree before heartbeats (git rev --baseline-rev,
       checked out into a temporary worktree), which streamed with `tail -F` and polled over SSH
  Interleaved A B A B, same profile, same hosts.

  Network bytes per node per minute while a run prints nothing: the client namespace's eth0 counters
  (both directions) over --window seconds of a silent 2-node run, divided by 2 nodes, for A and B.

Run as root: .venv/bin/python bench/heartbeat.py [--repeats 5] [--window 60] [--baseline-rev f975bd8]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, start_lab, summarize  # noqa: E402
from launch_overhead import TRAIN, first_step  # noqa: E402

IDLE = "import sys, time\nprint('idle start', flush=True)\ntime.sleep(float(sys.argv[1]))\nprint('idle end')\n"


def client_bytes(lab) -> int:
    """Bytes sent plus received so far on the client namespace's link to the hosts."""
    out = subprocess.run(lab.in_client(["cat", "/sys/class/net/eth0/statistics/rx_bytes",
                                        "/sys/class/net/eth0/statistics/tx_bytes"]),
                         capture_output=True, text=True, check=True).stdout.split()
    return sum(int(x) for x in out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--baseline-rev", default="f975bd8",
                        help="the tree to compare with (default: the last one before heartbeats)")
    args = parser.parse_args()
    baseline_tree = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-baseline-")) / "tree"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline_tree), args.baseline_rev],
                   check=True, capture_output=True)
    root, lab = start_lab("heartbeat")
    try:
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable) + TRAIN)
        project = root / "idle"
        project.mkdir()
        (project / "idle.py").write_text(IDLE)
        trees = {"this tree (node agents, heartbeats)": REPO, f"baseline {args.baseline_rev} (tail -F, polls)":
                 baseline_tree}

        def env_for(tree: Path) -> dict[str, str]:
            env = {**os.environ, "HOME": str(root), "FSDPCTL_RUNS_DIR": str(root / "runs"), "PYTHONPATH": str(tree)}
            env.pop("SSH_AUTH_SOCK", None)
            return env

        def launch(tree: Path, *extra: str, **popen) -> subprocess.Popen:
            return subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile),
                                                   *extra]), env=env_for(tree), text=True, **popen)

        def time_to_first_step(tree: Path) -> float:
            started = time.perf_counter()
            return first_step([launch(tree, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)], started)

        for tree in trees.values():
            time_to_first_step(tree)  # warm the tokenizer cache and the page cache
        samples = interleaved({name: (lambda tree=tree: time_to_first_step(tree)) for name, tree in trees.items()},
                              repeats=args.repeats, warmup=0)
        summary = summarize(samples, list(trees)[1])

        traffic = {}
        for name, tree in trees.items():
            process = launch(tree, "--code", str(project), "--", "idle.py", str(args.window + 30),
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert process.stdout is not None
            for line in process.stdout:
                if "idle start" in line:
                    break
            time.sleep(5)  # past the start: only the steady state counts
            before = client_bytes(lab)
            time.sleep(args.window)
            traffic[name] = (client_bytes(lab) - before) / 2 / (args.window / 60)
            process.send_signal(signal.SIGINT)  # what the baseline tree stops its nodes on too
            process.communicate(timeout=60)
        for name, per_minute in traffic.items():
            summary[name]["bytes_per_node_per_minute"] = per_minute
        report("heartbeat", list(trees)[1], summary,
               {"goal": "time to first step ratio ~1.0", "window_s": args.window, "baseline_rev": args.baseline_rev})
        for name, per_minute in traffic.items():
            print(f"{name}: {per_minute / 1024:.1f} KiB per node per minute while the run prints nothing")
    finally:
        lab.down()
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline_tree)],
                       capture_output=True)


if __name__ == "__main__":
    main()
