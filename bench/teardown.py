"""Fail-fast teardown at N nodes on the namespace testbed: when one rank dies, how long the other
nodes go on running.

  A: `fsdpctl launch` of a small program on N hosts (one rank each: gloo, a barrier every 0.1 s);
     once every rank is in its loop, the rank on node N/2 is killed (SIGKILL, by PID); timed from
     the kill to (1) the last process of the run gone from every node (those whose environment names
     the run: ranks, torchrun, the node script), (2) the last process whose command line names the
     program, as a user's `ps | grep beat.py` on each node finds them (the launcher, in the client's
     namespace, is on no node: the lab's hosts share this machine's PIDs, so a plain `ps` here sees it
     too), and (3) the launcher's exit
  B (baseline): the floor of tearing the same run down by hand once the failure is known: the
     same run, and `ssh HOST kill -KILL PIDS` to every node at once; timed from the first ssh to
     the last process gone
  A' (with --also-env KEY=VALUE): A again with that setting in the profile's env, e.g.
     FSDPCTL_GC_FREEZE=0 for the ranks and agents as they were before the start-up hook froze
     torch's import-time objects
Goal: A(1) <= 5 s at 16 nodes. Interleaved. Run as root:
  .venv/bin/python bench/teardown.py --nodes 16 [--repeats 3] [--also-env FSDPCTL_GC_FREEZE=0]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fsdpctl_env, interleaved, report, start_lab, summarize  # noqa: E402
from restart import Lines  # noqa: E402

from tests.testbed.lab import named_on_hosts, processes_of  # noqa: E402

PROGRAM = """import time
import torch.distributed as dist

dist.init_process_group("gloo")
rank, beats = dist.get_rank(), 0
while True:
    dist.barrier()
    beats += 1
    if rank == 0 and beats % 10 == 0:
        print(f"beat {beats}", flush=True)
    time.sleep(0.1)
"""
GOAL_SECONDS = 5.0


def wait_empty(run_id: str, since: float, nodes: int, timeout: float = 120.0) -> tuple[float, list[float]]:
    """Seconds from ``since`` until no process of the run is left, and until each node was empty."""
    deadline = time.monotonic() + timeout
    emptied: dict[int, float] = {}
    while True:
        left = {rank for pid in processes_of(run_id) if (rank := node_of(pid)) is not None}
        now = time.perf_counter() - since
        for rank in range(nodes):
            if rank not in left:
                emptied.setdefault(rank, now)
        if not left and len(emptied) == nodes:
            return now, [emptied[r] for r in range(nodes)]
        if time.monotonic() > deadline:
            raise SystemExit(f"processes of {run_id} still running {timeout:.0f} s after the failure")
        time.sleep(0.05)


def wait_named_gone(lab, program: str, since: float, timeout: float = 60.0) -> tuple[float, dict[int, str]]:
    """Seconds from ``since`` until no process on any node names ``program`` (a user's ``ps | grep`` on
    each node), and every one still there when the run's own count (its environment) was empty."""
    deadline = time.monotonic() + timeout
    seen: dict[int, str] = {}
    while time.monotonic() < deadline:
        now = named_on_hosts(lab, program)
        seen.update(now)
        if not now:
            return time.perf_counter() - since, seen
        time.sleep(0.05)
    raise SystemExit(f"processes naming {program} still on the nodes {timeout:.0f} s after the failure: {seen}")


def node_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    rank = next((v[len(b"FSDPCTL_NODE_RANK="):] for v in env if v.startswith(b"FSDPCTL_NODE_RANK=")), b"")
    return int(rank) if rank.isdigit() else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--also-env", default="", help="KEY=VALUE: measure A once more with it in the profile's env")
    args = parser.parse_args()
    names = tuple(f"n{i}" for i in range(1, args.nodes + 1))
    root, lab = start_lab(f"teardown_{args.nodes}", names)
    try:
        profile = root / "many.yaml"
        profile.write_text(lab.profile_yaml(list(names), python=sys.executable, name="many"))
        other_profile = root / "many_env.yaml"
        if args.also_env:
            key, _, value = args.also_env.partition("=")
            other_profile.write_text(lab.profile_yaml(list(names), python=sys.executable, name="many_env")
                                     + f"env:\n  {key}: {value!r}\n")
        code = root / "code"
        code.mkdir()
        (code / "beat.py").write_text(PROGRAM)
        env = fsdpctl_env(root)
        victim = args.nodes // 2
        launcher_exit: list[float] = []
        victim_empty: list[float] = []  # torchrun there noticed its rank's death and ended
        first_other: list[float] = []  # the first other node empty: fsdpctl's stop reached the nodes
        failed_lines: list[float] = []
        all_empty: list[float] = []  # every node: the run's own count
        named_gone: list[float] = []  # the user's count: no process naming beat.py on any node
        left_over: list[dict[int, str]] = []  # named after the run's own count said empty

        def start(chosen: Path = profile) -> tuple[subprocess.Popen, Lines, str]:
            before = set((root / "runs").glob("*")) if (root / "runs").exists() else set()
            process = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(chosen),
                                                      "--no-preflight", "--", "beat.py"]),
                                       cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            lines = Lines(process)
            lines.wait_for(r"beat 20\b")
            run_id = next(iter(set((root / "runs").glob("*")) - before)).name
            return process, lines, run_id

        def killed_rank(chosen: Path = profile) -> float:
            process, lines, run_id = start(chosen)
            workers = [pid for pid in processes_of(run_id, victim)
                       if b"beat.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
                       and b"torch.distributed.run" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
            if not workers:
                raise SystemExit(f"no rank process on node {victim}")
            killed = time.perf_counter()
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            empty, per_node = wait_empty(run_id, killed, args.nodes)
            gone, after = wait_named_gone(lab, "beat.py", killed)
            failed_line = lines.wait_for(r"^fsdpctl: run \S+ FAILED", killed) - killed
            process.wait(timeout=120)
            if chosen != profile:
                return empty
            launcher_exit.append(time.perf_counter() - killed)
            victim_empty.append(per_node[victim])
            others = [t for r, t in enumerate(per_node) if r != victim]
            first_other.append(min(others))
            failed_lines.append(failed_line)
            all_empty.append(empty)
            named_gone.append(gone)
            left_over.append(after)
            return empty

        def by_hand() -> float:
            process, lines, run_id = start()
            per_node = {rank: processes_of(run_id, rank) for rank in range(args.nodes)}
            key = str(lab.client_key)

            def kill(rank: int) -> None:
                host = lab.hosts[names[rank]]
                command = f"kill -KILL {' '.join(map(str, per_node[rank]))} 2>/dev/null; true"
                subprocess.run(lab.in_client(["ssh", "-i", key, "-o", f"UserKnownHostsFile={lab.known_hosts}",
                                              "-o", "BatchMode=yes", "-p", str(host.port), f"root@{host.address}",
                                              command]), capture_output=True, timeout=60)

            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.nodes) as pool:
                list(pool.map(kill, range(args.nodes)))
            empty, _ = wait_empty(run_id, started, args.nodes)
            process.send_signal(signal.SIGINT)  # the launcher: nothing left to stop
            process.wait(timeout=120)
            return empty

        case = f"fsdpctl: {args.nodes} nodes, a rank killed -> the last process of the run gone"
        baseline = "by hand: ssh kill -KILL to every node at once -> the last process gone"
        cases = {case: killed_rank, baseline: by_hand}
        if args.also_env:
            cases[f"{case}, with {args.also_env}"] = lambda: killed_rank(other_profile)
        samples = interleaved(cases, repeats=args.repeats, warmup=1)
        phases = {"the killed rank's node empty": victim_empty, "the first other node empty": first_other,
                  "the launcher's FAILED line": failed_lines, "the launcher exits": launcher_exit,
                  "no process on a node names beat.py (ps)": named_gone}
        for values in phases.values():
            del values[0]  # the warm-up's
        del all_empty[0]
        # The launcher's own lag, per run: what a user waits for once nothing of the run is left.
        phases["every node empty -> the FAILED line"] = [f - e for f, e in zip(failed_lines, all_empty, strict=True)]
        phases["every node empty -> the launcher exits"] = [x - e for x, e in
                                                            zip(launcher_exit, all_empty, strict=True)]
        ours = statistics.median(samples[case])
        report(f"teardown_{args.nodes}", baseline, summarize(samples, baseline),
               {"goal": f"the other nodes empty <= {GOAL_SECONDS} s after a rank dies", "empty_median_s": ours,
                "phases_median_s": {k: statistics.median(v) for k, v in phases.items()}, "phases_s": phases,
                "left_after_the_runs_count": [sorted(set(found.values())) for found in left_over[1:]]})
        print(f"  every node empty {ours:.2f} s after the kill (goal <= {GOAL_SECONDS} s)")
        for name, values in phases.items():
            print(f"  {name:32s} {statistics.median(values):6.2f} s (runs: {', '.join(f'{v:.2f}' for v in values)})")
        for found in left_over[1:]:
            for line in sorted(set(found.values())):
                print(f"  named beat.py after the kill: {line}")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
