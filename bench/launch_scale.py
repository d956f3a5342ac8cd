"""A whole run at 2-16 nodes against the same torchrun started by hand over ssh, where its seconds
went, and the launcher's own cost at 64 and 256 nodes.

Curve (``--nodes 2,4,8,16``), on the namespace testbed (each host its own sshd), a user's program
that prints 5 lines and sleeps 1 s, one rank per node:
  A: `fsdpctl launch -p PROFILE --code DIR -- five.py`, start to exit (the preflight included);
     the run's timeline (run.json) says where the seconds went
  A': the same with --no-preflight
  B (baseline): the node scripts `fsdpctl render` writes (the torchrun lines a user would type),
     the code put in place once (not timed), started by `ssh HOST bash nodeR.sh` on every node at
     once from the launcher's namespace, start to the last ssh's exit
Interleaved, medians. Every host shares this machine's 2 cores: torchrun's own start (torch imported
by every node's agent) is CPU this machine runs once per node, where real nodes run it at once.

Model (``--model 64,256``): N sshd hosts whose "torchrun" is a stand-in that imports no torch (it
prints the rank line fsdpctl's rank start-up prints, 5 lines, sleeps 1 s and exits), so that the
launcher's side is what grows: its wall time to every node started and to the end, its CPU, peak
memory, threads and open descriptors, per node. What it leaves out: torch's import and the
rendezvous on the nodes (each node's own CPUs on a real cluster), and NCCL's start-up.

Run as root: .venv/bin/python bench/launch_scale.py [--nodes 2,4,8,16] [--model 64,256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, fsdpctl_env, interleaved, machine, start_lab, summarize  # noqa: E402

FIVE = ("import os, time\nfor i in range(5):\n    print(f'line {i} rank {os.environ[\"RANK\"]}', flush=True)\n"
        "time.sleep(1)\n")
STAND_IN = r'''#!/bin/sh
# python for the model: torchrun is a stand-in that imports no torch; everything else is Python itself
if [ "$1" = "-m" ] && [ "$2" = "torch.distributed.run" ]; then
  exec "{python}" -c '
import os, sys, time
args = sys.argv[1:]
node = os.environ.get("FSDPCTL_NODE_RANK", "0")
print(f"fsdpctl: global rank {{node}} on node {{node}} (torchrun group rank {{node}})", file=sys.stderr, flush=True)
for i in range(5):
    print(f"line {{i}} rank {{node}}", flush=True)
time.sleep(1)
' "$@"
fi
exec "{python}" "$@"
'''


def profile_for(lab, root: Path, names: list[str], python: str, name: str) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(lab.profile_yaml(names, python=python, name=name))
    return path


def timeline_of(root: Path, run_id: str) -> dict[str, float]:
    """Each phase's done-at (seconds after the launch began) from the run's timeline."""
    from fsdpctl.rundir.timeline import rows

    record = json.loads((root / "runs" / run_id / "run.json").read_text())
    return {row["phase"]: row["done"] for row in rows(record.get("timeline"))}


class Launches:
    """fsdpctl launches of one profile: wall seconds, and each one's timeline kept."""

    def __init__(self, lab, root: Path, env: dict[str, str], code: Path):
        self.lab, self.root, self.env, self.code = lab, root, env, code
        self.timelines: dict[str, list[dict[str, float]]] = {}

    def run(self, profile: Path, label: str, *extra: str, tree: Path | None = None) -> float:
        """One launch (``tree``: of another checkout of fsdpctl, e.g. the commit before)."""
        before = set((self.root / "runs").glob("*")) if (self.root / "runs").exists() else set()
        env = {**self.env, "PYTHONPATH": str(tree)} if tree is not None else self.env
        started = time.perf_counter()
        subprocess.run(self.lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile), *extra,
                                           "--code", str(self.code), "--", "five.py"]),
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        took = time.perf_counter() - started
        (new,) = set((self.root / "runs").glob("*")) - before
        timed = timeline_of(self.root, new.name)
        if timed:
            self.timelines.setdefault(label, []).append(timed)
        return took


def by_hand(lab, root: Path, env: dict[str, str], profile: Path, names: list[str], code: Path) -> float:
    """The node scripts started over ssh on every node at once (code in place beforehand)."""
    out = root / f"rendered-{time.monotonic_ns()}"
    subprocess.run([sys.executable, "-m", "fsdpctl", "render", "-p", str(profile), "--out", str(out), "--code",
                    str(code), "--", "five.py"], env=env, check=True, capture_output=True, cwd=code)
    run_dir = Path(json.loads((out / "plan.json").read_text())["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "pkg").symlink_to(REPO, target_is_directory=True)
    (run_dir / "code").symlink_to(code, target_is_directory=True)
    ssh = ["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={lab.known_hosts}"]

    def one(rank_name: tuple[int, str]) -> int:
        rank, name = rank_name
        return subprocess.run(lab.in_client([*ssh, f"root@{lab.hosts[name].address}", "bash",
                                             str(out / f"node{rank}.sh")]),
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        codes = list(pool.map(one, enumerate(names)))
    took = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"a node script started by hand failed: {codes}")
    return took


def the_program(root: Path) -> Path:
    """The folder of the 5-line program every launch runs."""
    code = root / "five"
    code.mkdir()
    (code / "five.py").write_text(FIVE)
    return code


def curve(args) -> dict:
    sizes = [int(n) for n in args.nodes.split(",") if n]
    names = [f"h{i}" for i in range(1, max(sizes) + 1)]
    root, lab = start_lab("launch_scale", tuple(names))
    try:
        env, code = fsdpctl_env(root), the_program(root)
        launches = Launches(lab, root, env, code)
        out = {}
        for size in sizes:
            profile = profile_for(lab, root, names[:size], sys.executable, f"n{size}")
            label = f"fsdpctl launch, {size} nodes"
            quick = f"fsdpctl launch --no-preflight, {size} nodes"
            hand = f"by hand over ssh, {size} nodes"
            cases = {label: lambda p=profile, lb=label: launches.run(p, lb),
                     quick: lambda p=profile, lb=quick: launches.run(p, lb, "--no-preflight"),
                     hand: lambda p=profile, s=size: by_hand(lab, root, env, p, names[:s], code)}
            if args.before:
                cases[f"fsdpctl launch before ({args.before}), {size} nodes"] = (
                    lambda p=profile: launches.run(p, "before", tree=Path(args.before)))
            samples = interleaved(cases, repeats=args.repeats, warmup=1)
            summary = summarize(samples, hand)
            phases = {}
            for case in (label, quick):
                timed = launches.timelines[case][1:]  # the warm-up's left out
                phases[case] = {phase: round(statistics.median(t[phase] for t in timed if phase in t), 2)
                                for phase in timed[-1]}
            out[str(size)] = {"cases": summary, "timeline_done_at_median_s": phases}
            for case, row in summary.items():
                print(f"{case:42s} {row['median_s']:7.2f} s  ratio {row['ratio_to_baseline']:.2f}", flush=True)
            print(f"  where fsdpctl's seconds went ({size} nodes): {phases[label]}", flush=True)
        return out
    finally:
        lab.down()


def available_kb() -> int:
    """This machine's available memory (every fake node's processes included)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


class Watch:
    """The launcher's peak threads, open descriptors and memory, and the least memory this machine
    had available (the nodes' sshd sessions, shells and agents with it), sampled every 0.1 s."""

    def __init__(self, pid: int):
        self.pid, self.threads, self.fds, self.rss_kb = pid, 0, 0, 0
        self.least_available_kb = available_kb()
        self.began = time.perf_counter()
        self.cpu: list[tuple[float, float]] = []  # (seconds since began, the launcher's CPU seconds)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def cpu_by(self, seconds: float) -> float:
        """The launcher's CPU seconds ``seconds`` after it began (the last sample before then)."""
        return max((cpu for at, cpu in self.cpu if at <= seconds), default=0.0)

    def _loop(self) -> None:
        while not self.done.is_set():
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                self.threads = max(self.threads, int(fields["Threads"]))
                self.rss_kb = max(self.rss_kb, int(fields["VmRSS"].split()[0]))
                self.fds = max(self.fds, len(os.listdir(f"/proc/{self.pid}/fd")))
                self.least_available_kb = min(self.least_available_kb, available_kb())
                ticks = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()[11:13]
                self.cpu.append((time.perf_counter() - self.began, sum(map(int, ticks)) / os.sysconf("SC_CLK_TCK")))
            except (OSError, KeyError, ValueError):
                pass
            self.done.wait(0.1)


def model(args) -> dict:
    out = {}
    for size in [int(n) for n in args.model.split(",") if n]:
        names = [f"m{i}" for i in range(1, size + 1)]
        root, lab = start_lab("launch_scale_model", tuple(names), own_shell_rc=not args.shared_rc)
        try:
            env, code = fsdpctl_env(root), the_program(root)
            python = root / "python"
            python.write_text(STAND_IN.format(python=sys.executable))
            python.chmod(0o755)
            profile = profile_for(lab, root, names, str(python), f"m{size}")
            # fsdpctl's default connect timeout, not the testbed's 3 s: a handshake here shares 2 cores
            # with every other node's sshd, where a real node's has its own
            profile.write_text(profile.read_text().replace("connect_timeout: 3\n", "connect_timeout: 10\n"))
            if args.model_node_timeout:  # every "node" shares this machine's cores with the launcher
                profile.write_text(profile.read_text() + f"node_timeout: {args.model_node_timeout}\n")
            rows = []
            for _ in range(args.repeats):
                before = set((root / "runs").glob("*")) if (root / "runs").exists() else set()
                started = time.perf_counter()
                # the launcher itself, not `ip netns exec` (which execs it: the same process)
                err_path = root / f"launch-{time.monotonic_ns()}.err"
                with err_path.open("w") as err_file:
                    process = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p",
                                                              str(profile), *args.model_flags.split(),
                                                              "--code", str(code), "--", "five.py"]),
                                               env=env, stdout=err_file, stderr=subprocess.STDOUT)
                idle_kb = available_kb()
                watch = Watch(process.pid)
                _, status, usage = os.wait4(process.pid, 0)  # its own CPU (`ip netns exec` execs it)
                process.returncode = os.waitstatus_to_exitcode(status)
                took = time.perf_counter() - started
                watch.done.set()
                if process.returncode != 0:
                    said = [line for line in err_path.read_text().splitlines() if "FAIL" in line or "hint" in line]
                    raise SystemExit(f"the {size}-node launch failed: " + "\n".join(said[-40:]))
                (new,) = set((root / "runs").glob("*")) - before
                stat = json.loads((root / "runs" / new.name / "run.json").read_text())
                phases = timeline_of(root, new.name)
                dropped = len(((stat.get("timeline") or {}).get("phases") or {}).get("dropped") or {})
                rows.append({"wall_s": took, "cpu_s": usage.ru_utime + usage.ru_stime, "dropped_nodes": dropped,
                             "cpu_to_ranks_s": watch.cpu_by(phases.get("torchrun", took)),
                             "testbed_mb": (idle_kb - watch.least_available_kb) / 1024,
                             "threads_peak": watch.threads, "fds_peak": watch.fds,
                             "rss_peak_mb": watch.rss_kb / 1024, "phases": phases,
                             "state": stat.get("state")})
            cpu = round(statistics.median(r["cpu_s"] for r in rows), 2)
            best = min(rows, key=lambda r: r["wall_s"])
            out[str(size)] = {
                "wall_median_s": statistics.median(r["wall_s"] for r in rows),
                "agents_started_median_s": statistics.median(r["phases"].get("agents", 0) for r in rows),
                "launcher_cpu_s": cpu, "launcher_cpu_ms_per_node": 1000 * cpu / size,
                "threads_peak": max(r["threads_peak"] for r in rows), "fds_peak": max(r["fds_peak"] for r in rows),
                "rss_peak_mb": round(max(r["rss_peak_mb"] for r in rows), 1),
                "rss_kb_per_node": round(1024 * max(r["rss_peak_mb"] for r in rows) / size, 1),
                "ranks_started_median_s": statistics.median(r["phases"].get("torchrun", 0) for r in rows),
                "ranks_started_ms_per_node": round(1000 * statistics.median(r["phases"].get("torchrun", 0)
                                                                            for r in rows) / size, 1),
                "launcher_cpu_ms_per_node_to_ranks_started": round(
                    1000 * statistics.median(r["cpu_to_ranks_s"] for r in rows) / size, 1),
                "dropped_nodes_max": max(r["dropped_nodes"] for r in rows),
                "testbed_memory_peak_mb": round(max(r["testbed_mb"] for r in rows)),
                "testbed_memory_mb_per_node": round(max(r["testbed_mb"] for r in rows) / size, 2),
                "timeline_done_at_s (fastest run)": best["phases"]}
            out[str(size)]["flags"] = args.model_flags
            out[str(size)]["node_timeout"] = args.model_node_timeout or 30
            print(f"model {size} nodes: {json.dumps(out[str(size)])}", flush=True)
        finally:
            lab.down()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="2,4,8,16")
    parser.add_argument("--model", default="64,256")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="launch_scale")
    parser.add_argument("--model-node-timeout", type=int, default=0, help="the model profile's node_timeout")
    parser.add_argument("--model-flags", default="", help="launch flags for the model, e.g. --no-preflight")
    parser.add_argument("--shared-rc", action="store_true", help="the model's hosts read this machine's ~/.bashrc "
                        "(default: an empty one each, as a real node's own)")
    parser.add_argument("--before", default="", help="another checkout of fsdpctl, measured beside this one")
    args = parser.parse_args()
    data = {"benchmark": "launch_scale", "machine": machine(),
            "goal": "whole run <= 1.15x torchrun by hand at 16 nodes; nothing growing faster than linearly"}
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / f"{args.out}.json"
    if args.nodes:
        data["curve"] = curve(args)
        target.write_text(json.dumps(data, indent=2) + "\n")  # kept, whatever the model does
    if args.model:
        data["model"] = model(args)
        target.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
