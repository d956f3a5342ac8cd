"""What following a run costs the launcher at 16, 64 and 256 nodes, per node per second, while the run
goes (its start and end left out): the collector taking every node's log, metrics rows and GPU samples
(8 GPUs per node sampled every 5 s by a fake nvidia-smi), the chart index and the exports (TensorBoard
and Prometheus) written as they come.

Every node runs one rank of a program that prints a step line and writes a metrics row every 0.5 s.
As in launch_scale's model, "torchrun" on the nodes is a stand-in that imports no torch (every host
shares this machine's 2 cores with the launcher). The launcher's CPU (user + system, from /proc) over
a window once every node has logged a few steps, divided by the window and the nodes; the same for
each tree given with ``--trees`` (an older checkout, its own launcher on the same testbed), in turn.

Run as root: .venv/bin/python bench/collector_scale.py [--nodes 16,64,256] [--window 30]
             [--trees this,154eb94] [--exported this,154eb94]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, fsdpctl_env, machine  # noqa: E402

from tests.testbed import fake_gpu  # noqa: E402
from tests.testbed.lab import Lab, netns_available  # noqa: E402

STAND_IN = r'''#!/bin/sh
# python on the nodes: torchrun is a stand-in that runs one rank of the program and imports no torch
if [ "$1" = "-m" ] && [ "$2" = "torch.distributed.run" ]; then
  exec "{python}" -c '
import json, os, time
rank = int(os.environ.get("FSDPCTL_NODE_RANK", "0"))
run_dir = os.environ.get("FSDPCTL_RUN_DIR", ".")
print(f"fsdpctl: global rank {{rank}} on node {{rank}} (torchrun group rank {{rank}})", flush=True)
for step in range(1, 100000):
    time.sleep(0.5)
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as out:
        out.write(json.dumps({{"step": step, "rank": rank, "loss": 4.0 / step, "step_time_s": 0.5,
                              "time": time.time()}}) + "\n")
    print(f"step={{step}} loss={{4.0 / step:.4f}}", flush=True)
'
fi
exec "{python}" "$@"
'''


PROFILE_TO = os.environ.get("FSDPCTL_BENCH_PYSPY", "")
"""Where py-spy writes the launcher's stacks over the window (raw), when set."""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def one(lab: Lab, root: Path, tree: Path, profile: Path, nodes: int, window: float) -> dict:
    env = {**fsdpctl_env(root), "PYTHONPATH": str(tree)}
    code = root / "code"
    code.mkdir(exist_ok=True)
    (code / "steps.py").write_text("# the stand-in torchrun runs the steps itself\n")
    before = set((root / "runs").glob("*")) if (root / "runs").exists() else set()
    said = root / f"launch-{nodes}-{tree.name}.out"
    # (no preflight: what is measured is the run going on, and the tree before the collector's
    # preflight fails its port check at 64 hosts on this testbed)
    launcher = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile),
                                               "--no-preflight", "--code", str(code), "--", "steps.py"]),
                                env=env, cwd=root, stdout=said.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300 + 5 * nodes  # 256 agents start on this machine's 2 cores
        merged = None
        while time.monotonic() < deadline:
            new = set((root / "runs").glob("*")) - before if (root / "runs").exists() else set()
            merged = next(iter(new)) / "logs" / "merged.log" if new else None
            if merged is not None and merged.exists() and merged.read_bytes().count(b"step=5 ") >= nodes:
                break
            if launcher.poll() is not None:
                tail = "\n".join(said.read_text(errors="replace").splitlines()[-15:])
                raise SystemExit(f"the {nodes}-node launch ended early ({launcher.returncode}):\n{tail}")
            time.sleep(1)
        else:
            raise SystemExit(f"the {nodes}-node run never had every node at step 5")
        time.sleep(5)  # past the first samples and the exports' first writes
        if PROFILE_TO:
            subprocess.Popen([str(REPO / ".venv" / "bin" / "py-spy"), "record", "-p", str(launcher.pid), "-d",
                              str(int(window)), "-r", "100", "-f", "raw", "-o", PROFILE_TO],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu0, wall0 = cpu_seconds(launcher.pid), time.monotonic()
        lines0 = merged.read_bytes().count(b"\n")
        time.sleep(window)
        cpu, wall = cpu_seconds(launcher.pid) - cpu0, time.monotonic() - wall0
        lines = merged.read_bytes().count(b"\n") - lines0
    finally:
        launcher.terminate()
        launcher.wait(timeout=300)
    return {"launcher_cpu_s": round(cpu, 2), "window_s": round(wall, 1), "pct_of_a_core": round(100 * cpu / wall, 2),
            "cpu_ms_per_node_per_s": round(1000 * cpu / wall / nodes, 3),
            "lines_per_s": round(lines / wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="16,64,256")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--sample-seconds", type=int, default=5,
                        help="the GPUs' sampling interval; 256 nodes' fake nvidia-smi every 5 s (a Python process "
                             "each, every node on this machine's 2 cores) took more than both cores")
    parser.add_argument("--trees", default="this,154eb94",
                        help="'this' and git revisions (the tree before the collector: 154eb94)")
    parser.add_argument("--exports-off", action="store_true", help="this tree without exports too")
    parser.add_argument("--exported", default="this",
                        help="the trees run with the exports on (the others without): 'this,b07a85d' compares "
                             "two trees' collectors, exports on in both")
    parser.add_argument("--shared-workdir", action="store_true",
                        help="every host's run directory is one folder (storage the nodes share, the launcher not)")
    parser.add_argument("--out", help="the results file's name in bench/results (default: by the case)")
    args = parser.parse_args()
    out_name = args.out or ("collector_scale_shared_workdir.json" if args.shared_workdir else "collector_scale.json")
    reason = netns_available()
    if reason:
        sys.exit(f"collector_scale: the namespace testbed {reason}")
    work = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-collector-"))
    trees: dict[str, Path] = {}
    for name in args.trees.split(","):
        if name == "this":
            trees[name] = REPO
        else:
            trees[name] = work / f"tree-{name}"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(trees[name]), name],
                           check=True, capture_output=True)
    result = {"benchmark": "collector_scale", "machine": machine(), "trees": list(trees),
              "what": "the launcher's CPU while a run goes, per node per second: log, metrics rows every 0.5 s, "
                      f"8 GPUs sampled every {args.sample_seconds} s per node; this tree with its chart index and "
                      "exports on",
              "workdir": "shared by the nodes" if args.shared_workdir else "each node its own", "sizes": {}}
    try:
        for size in [int(n) for n in args.nodes.split(",") if n]:
            names = [f"c{i}" for i in range(1, size + 1)]
            root = work / f"n{size}"
            lab = Lab(root / "lab", names).up()
            # Every host's sessions read an empty ~/.bashrc of their own (harness.start_lab says why) and,
            # unless --shared-workdir, see a work folder of their own, as separate machines have: nodes that
            # share one run directory each send the same metrics.jsonl (every rank's rows, once per node).
            rc = root / "node-bashrc"
            rc.write_text("")
            shared = {str(Path.home() / ".bashrc"): rc} if (Path.home() / ".bashrc").is_file() else {}
            (lab.root / "work").mkdir(exist_ok=True)
            try:
                for name in names:
                    scenario = lab.hosts[name].dir / "gpu.json"
                    bin_dir = fake_gpu.install(lab.hosts[name].dir / "bin", scenario)
                    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x18 + g, **{"clocks.sm": 1980}) for g in range(8)])
                    overlays = dict(shared)
                    if not args.shared_workdir:
                        own = lab.hosts[name].dir / "work"
                        own.mkdir(exist_ok=True)
                        overlays[str(lab.root / "work")] = own
                    lab.start_sshd(name, f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n", overlays=overlays)
                python = root / "python"
                python.write_text(STAND_IN.format(python=sys.executable))
                python.chmod(0o755)
                # (the lab's 3 s connect timeout is for tests of a few hosts: 256 sessions opened on this
                # machine's 2 cores, beside 256 sshds, take longer to open a channel, as in launch_scale)
                sampling = f"health:\n  sample_seconds: {args.sample_seconds}\nnode_timeout: 120\n"
                base = lab.profile_yaml(names, python=str(python), name=f"c{size}", extra=sampling).replace(
                    "connect_timeout: 3\n", "connect_timeout: 10\n")
                plain, exported = root / "plain.yaml", root / "exported.yaml"
                plain.write_text(base)
                (root / "prom").mkdir()
                exported.write_text(base + f"export:\n  tensorboard: {root / 'tb'}\n  prometheus: {root / 'prom'}\n")
                found = {}
                with_exports = set(args.exported.split(","))
                cases = [(f"{name} (collector + exports)" if name in with_exports else name, tree,
                          exported if name in with_exports else plain) for name, tree in trees.items()]
                if "this" in trees and args.exports_off:
                    cases.insert(1, ("this (collector, no exports)", REPO, plain))
                for name, tree, profile in cases:
                    found[name] = one(lab, root, tree, profile, size, args.window)
                    print(f"{size} nodes, {name}: {json.dumps(found[name])}", flush=True)
                result["sizes"][str(size)] = found
                RESULTS.mkdir(exist_ok=True)  # each size as it is done: a larger one may not finish
                (RESULTS / out_name).write_text(json.dumps(result, indent=2) + "\n")
            finally:
                lab.down()
    finally:
        for name, tree in trees.items():
            if name != "this":
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / out_name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
