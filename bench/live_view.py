"""What watching a run costs, on the namespace testbed at N nodes, each with a fake nvidia-smi of 8 GPUs
sampled every 5 s, and a program of one rank per node that logs a step (a line, and a metrics row per
rank) every 0.5 s:

  1. the launcher's CPU time (user + system, the whole launch) with the collector and the exports
     (TensorBoard and Prometheus) on, with the collector only, and the baseline: the same launch from
     the tree before the collector (git rev --baseline-rev in a temporary worktree). Interleaved.
     Goal: collector + exports <= 1.05x the baseline.
  2. ``fsdpctl top`` on a live run, drawn in tmux (120x40): its CPU (% of one core) and memory over
     the window (goal <= 5 %), and the time from a step line landing in the launcher's merged.log to
     the screen showing that step (goal <= 1 s; looked at every 50 ms).
  3. the nodes' cost with ten ``top``s open against none: new SSH sessions on the nodes and the CPU
     time of everything running on them, over equal windows (goal: the same).

Run as root: .venv/bin/python bench/live_view.py [--nodes 16] [--repeats 3] [--window 60]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fsdpctl_env, interleaved, report, summarize  # noqa: E402

from tests.testbed import fake_gpu  # noqa: E402
from tests.testbed.lab import Lab, netns_available  # noqa: E402

PROGRAM = """import json, os, sys, time
rank, run_dir = int(os.environ["RANK"]), os.environ["FSDPCTL_RUN_DIR"]
for step in range(1, int(sys.argv[1]) + 1):
    time.sleep(0.5)
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as out:
        out.write(json.dumps({"step": step, "rank": rank, "loss": 4.0 / step, "step_time_s": 0.5,
                              "time": time.time()}) + "\\n")
    if rank == 0:
        print(f"step={step} loss={4.0 / step:.4f}", flush=True)
"""
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def launcher_cpu(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """CPU seconds (user + system) the launcher process and what it waited for used."""
    before = os.times()
    subprocess.run(argv, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


class Screen:
    """A tmux server of its own running one command."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path):
        self.socket = f"fsdpctl-bench-{name}-{os.getpid()}"
        words = ["env", *(f"{k}={env[k]}" for k in ("HOME", "FSDPCTL_RUNS_DIR", "PYTHONPATH", "PATH")), *argv]
        subprocess.run(["tmux", "-L", self.socket, "new-session", "-d", "-s", "s", "-x", "120", "-y", "40", "-c",
                        str(cwd), subprocess.list2cmdline(words)], check=True, env={**os.environ, "TERM": "xterm"})

    def text(self) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "capture-pane", "-p", "-t", "s"], capture_output=True,
                              text=True).stdout

    def pid(self) -> int:
        """The command's process (the python under ``ip netns exec``)."""
        shell = subprocess.run(["tmux", "-L", self.socket, "list-panes", "-F", "#{pane_pid}"], capture_output=True,
                               text=True).stdout.split()[0]
        found = int(shell)
        for _ in range(5):  # env -> ip netns exec -> python: the python is the leaf
            children = Path(f"/proc/{found}/task/{found}/children").read_text().split()
            if not children:
                break
            found = int(children[0])
        return found

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def node_cost(lab: Lab, logs_from: dict[str, int]) -> tuple[int, float]:
    """(SSH sessions the nodes' sshd accepted since ``logs_from``, CPU seconds of every process in the
    nodes' namespaces now)."""
    sessions = sum(host.log.read_bytes()[logs_from[name]:].count(b"Accepted publickey")
                   for name, host in lab.hosts.items())
    cpu = 0.0
    for host in lab.hosts.values():
        pids = subprocess.run(["ip", "netns", "pids", host.namespace], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                cpu += cpu_seconds(int(pid))
            except (OSError, IndexError):
                continue
    return sessions, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--baseline-rev", default="154eb94", help="the tree before the collector")
    args = parser.parse_args()
    reason = netns_available()
    if reason:
        sys.exit(f"live_view: the namespace testbed {reason}")
    names = tuple(f"n{i}" for i in range(1, args.nodes + 1))
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-live-"))
    baseline_tree = root / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline_tree), args.baseline_rev],
                   check=True, capture_output=True)
    lab = Lab(root / "lab", list(names)).up()
    try:
        for name in names:
            scenario = lab.hosts[name].dir / "gpu.json"
            bin_dir = fake_gpu.install(lab.hosts[name].dir / "bin", scenario)
            fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x18 + g, **{"clocks.sm": 1980, "utilization.gpu": 97})
                                               for g in range(8)])
            lab.start_sshd(name, f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n")
        code = root / "code"
        code.mkdir()
        (code / "steps.py").write_text(PROGRAM)
        base = lab.profile_yaml(list(names), python=sys.executable, name="live", extra="health:\n  sample_seconds: 5\n")
        plain = root / "plain.yaml"
        plain.write_text(base)
        exported = root / "exported.yaml"
        (root / "prom").mkdir()
        exported.write_text(base + f"export:\n  tensorboard: {root / 'tb'}\n  prometheus: {root / 'prom'}\n")
        env = fsdpctl_env(root)

        def launch(tree: Path, profile: Path, steps: int = 40):
            run_env = {**env, "PYTHONPATH": str(tree)}
            argv = lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile), "--code", str(code),
                                  "--", "steps.py", str(steps)])
            return lambda: launcher_cpu(argv, run_env, code)

        cases = {"collector + exports (this tree)": launch(REPO, exported),
                 "collector (this tree)": launch(REPO, plain),
                 f"baseline {args.baseline_rev}": launch(baseline_tree, plain)}
        samples = interleaved(cases, repeats=args.repeats, warmup=1)
        summary = summarize(samples, f"baseline {args.baseline_rev}")  # (its "seconds" are CPU seconds)

        # 2 and 3: one long run, watched
        steps = int((3 * args.window + 60) / 0.5)
        runs_before = set((root / "runs").glob("*"))
        launcher = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(exported),
                                                   "--code", str(code), "--", "steps.py", str(steps)]),
                                    env=env, cwd=code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not (new := set((root / "runs").glob("*")) - runs_before) and time.monotonic() < deadline:
                time.sleep(0.2)
            run_dir = next(iter(new))
            merged = run_dir / "logs" / "merged.log"
            while not merged.exists() or b"step=3 " not in merged.read_bytes():
                time.sleep(0.2)
            top = Screen("top", lab.in_client([sys.executable, "-m", "fsdpctl", "top", run_dir.name]), env, code)
            try:
                time.sleep(3)
                pid = top.pid()
                cpu0, wall0 = cpu_seconds(pid), time.monotonic()
                landed: dict[int, float] = {}
                shown: dict[int, float] = {}
                offset = merged.stat().st_size
                rss = []
                while time.monotonic() - wall0 < args.window:
                    with merged.open("rb") as handle:
                        handle.seek(offset)
                        data = handle.read()
                    offset += len(data)
                    now = time.monotonic()
                    for step in re.findall(rb"step=(\d+) loss", data):
                        landed.setdefault(int(step), now)
                    match = re.search(r"step ([\d,]+)", top.text())
                    if match:
                        shown.setdefault(int(match.group(1).replace(",", "")), time.monotonic())
                    rss.append(rss_mb(pid))
                    time.sleep(0.05)
                top_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0)
            finally:
                top.close()
            latencies = [shown[s] - landed[s] for s in landed if s in shown and shown[s] >= landed[s]]

            def cost(tops: int) -> dict[str, float]:
                logs_from = {name: host.log.stat().st_size for name, host in lab.hosts.items()}
                screens = [Screen(f"ten{i}", lab.in_client([sys.executable, "-m", "fsdpctl", "top", run_dir.name]),
                                  env, code) for i in range(tops)]
                try:
                    _, cpu_before = node_cost(lab, logs_from)
                    time.sleep(args.window / 2)
                    sessions, cpu_after = node_cost(lab, logs_from)
                finally:
                    for screen in screens:
                        screen.close()
                return {"new_ssh_sessions": sessions, "node_cpu_s": round(cpu_after - cpu_before, 2)}

            none, ten = cost(0), cost(10)
        finally:
            launcher.terminate()
            launcher.wait(timeout=120)
        extra = {
            "goal": "launcher CPU with collector+exports <= 1.05x; top <= 5% of a core; a step shown <= 1 s after it "
                    "lands; the nodes' cost the same with ten tops as with none",
            "nodes": args.nodes, "gpus_per_node": 8, "sample_seconds": 5,
            "top_cpu_pct_of_a_core": round(100 * top_cpu, 2), "top_rss_mb_max": round(max(rss), 1),
            "step_shown_after_landing_s": {"median": round(statistics.median(latencies), 3),
                                           "max": round(max(latencies), 3), "n": len(latencies)},
            "nodes_cost_no_top": none, "nodes_cost_ten_tops": ten}
        report(f"live_view_{args.nodes}", f"baseline {args.baseline_rev}", summary, extra)
        print(json.dumps(extra, indent=2))
    finally:
        lab.down()
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline_tree)],
                       capture_output=True)


if __name__ == "__main__":
    main()
