"""Recovery with a spare host on the namespace testbed: from a node's failure to the first step of
the next attempt on a spare, at N+1 nodes.

  A: `fsdpctl launch --max-restarts 1` on N hosts with one spare; once step 6 is logged (the newest
     checkpoint being step 5's), the last host's link goes down; timed from the cut to the first
     `step=` line of attempt 2, which runs on the N-1 healthy hosts and the spare
  B (baseline): the same run started fresh by hand on those same hosts: its node scripts (the
     torchrun lines a user would type) started in each host's namespace at once, no SSH; timed to
     the first `step=` line
Goal: A <= the node timeout + 1.2 x B. Interleaved; A is also split into where its time goes, from
the launcher's own lines:
  detect + tear down   the cut -> fsdpctl's FAILED line (the node timeout: nothing heard from the node;
                       the others stopped, the logs collected)
  decide               -> the "attempt 2 of 2" line (the newest checkpoint found)
  replace + start      -> "attempt 2 started" (the spare chosen, the re-check, staging and starting)
  to the first step    -> the first `step=` line (rendezvous, imports, data, model, the checkpoint, a step)
Run as root: .venv/bin/python bench/spare_recovery.py --nodes 2 [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fsdpctl_env, interleaved, report, start_lab, summarize  # noqa: E402
from restart import Lines, fresh_by_hand  # noqa: E402

TRAIN = ("train:\n  preset: tiny\n  steps: 14\n  batch_size: 16\n  seq_len: 128\n  log_interval: 1\n"
         "  eval_interval: 0\n  eval_steps: 1\n  vocab_size: 2000\n  checkpoint_interval: 5\n")
NODE_TIMEOUT = 5
PHASES = ("detect + tear down", "decide", "replace + start", "to the first step")


def spares_yaml(lab, names: list[str]) -> str:
    return "spares:\n" + "".join(f"  - host: {lab.hosts[n].address}\n    port: {lab.hosts[n].port}\n" for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2, help="nodes the run uses (one more is the spare)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    names = [f"n{i}" for i in range(1, args.nodes + 2)]
    hosts, spare, victim = names[:-1], names[-1], names[-2]
    root, lab = start_lab(f"spare_recovery_{args.nodes}", tuple(names))
    try:
        profile = root / "spared.yaml"
        profile.write_text(lab.profile_yaml(hosts, python=sys.executable, name="spared") + spares_yaml(lab, [spare])
                           + TRAIN)
        after = root / "after.yaml"  # the hosts attempt 2 runs on, as a fresh launch would use them
        after.write_text(lab.profile_yaml([*hosts[:-1], spare], python=sys.executable, name="after") + TRAIN)
        env = fsdpctl_env(root)
        fsdpctl = [sys.executable, "-m", "fsdpctl"]
        phases: dict[str, list[float]] = {name: [] for name in PHASES}
        cut = ["ip", "-n", lab.hosts[victim].namespace, "link", "set", "eth0"]

        def replaced() -> float:
            state = root / f"state-{time.monotonic_ns()}"  # no exclusion left over from the last repeat
            before = set((root / "runs").glob("*")) if (root / "runs").exists() else set()
            process = subprocess.Popen(lab.in_client([*fsdpctl, "launch", "-p", str(profile), "--max-restarts", "1",
                                                      "--node-timeout", str(NODE_TIMEOUT)]),
                                       env={**env, "FSDPCTL_STATE_DIR": str(state)}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
            lines = Lines(process)
            lines.wait_for(r"step=6 loss=")
            run_dir = next(iter(set((root / "runs").glob("*")) - before))
            subprocess.run([*cut, "down"], check=True)
            try:
                down = time.perf_counter()
                failed = lines.wait_for(r"^fsdpctl: run \S+ FAILED:", down)
                decided = lines.wait_for(r"^fsdpctl: attempt 2 of 2 from step 5 ", down)
                started = lines.wait_for(r"^fsdpctl: run \S+ attempt 2 started", down)
                first = lines.wait_for(r"step=6 loss=", started)
                if process.wait(timeout=300) != 0:
                    raise SystemExit(f"the run with a spare failed (exit {process.returncode})")
            finally:
                subprocess.run([*cut, "up"], check=True)
            record = json.loads((run_dir / "run.json").read_text())
            if [r["by"] for r in record.get("replacements", ())] != [lab.hosts[spare].address]:
                raise SystemExit(f"attempt 2 did not run on the spare: {record.get('replacements')}")
            for name, seconds in zip(PHASES, (failed - down, decided - failed, started - decided, first - started),
                                     strict=True):
                phases[name].append(seconds)
            return first - down

        def by_hand() -> float:
            return fresh_by_hand(root, lab, after, [*hosts[:-1], spare], env)

        case = f"fsdpctl: {args.nodes}+1 nodes, link cut -> first step on the spare"
        baseline = "the same run started fresh by hand on those hosts"
        samples = interleaved({case: replaced, baseline: by_hand}, repeats=args.repeats, warmup=1)
        for values in phases.values():
            del values[0]  # the warm-up's
        where = {name: statistics.median(values) for name, values in phases.items()}
        fresh = statistics.median(samples[baseline])
        ours = statistics.median(samples[case])
        report(f"spare_recovery_{args.nodes}", baseline, summarize(samples, baseline),
               {"goal": "recovery <= node timeout + 1.2 x a fresh start", "node_timeout_s": NODE_TIMEOUT,
                "beyond_node_timeout_over_fresh": (ours - NODE_TIMEOUT) / fresh, "phases_median_s": where,
                "phases_s": phases})
        for name, seconds in where.items():
            print(f"  {name:20s} {seconds:6.2f} s")
        print(f"  (recovery - node timeout) / fresh start = {(ours - NODE_TIMEOUT) / fresh:.2f} (goal <= 1.2)")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
