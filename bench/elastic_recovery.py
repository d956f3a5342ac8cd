"""An elastic run on the namespace testbed, no spare anywhere: from a node's loss to the first step on
the nodes left, and from the checkpoint where a short run grows back to its first step on all of them.

  shrink: `fsdpctl launch` on N hosts with `elastic: {min_nodes: N-1}` and `--max-restarts 1`; once step
          6 is logged (the newest checkpoint being step 5's), the last host's link goes down; timed from
          the cut to the first `step=` line of attempt 2 on the N-1 hosts left
  grow:   the same run started with the last host excluded (it starts short, on N-1 hosts); at step 1
          the host is restored (`hosts --restore`); timed from the workload's "checkpoint step=5
          saved" line (step 10's where its re-check outran step 5) to the first `step=` line of
          attempt 2 on all N hosts
  baselines: the same run (the same global batch) started fresh by hand on N-1 hosts and on N hosts:
          its node scripts started in each host's namespace at once, no SSH; timed to the first `step=`
Goals: shrink - node timeout <= 1.2 x the fresh start on N-1; grow <= 1.2 x the fresh start on N.
Also said: how long after rank 0 printed attempt 2's first step (its metrics row's time) the launcher
showed the line (the by-hand start shows torchrun's output at once).
Interleaved; each is split where its time goes, from the launcher's own lines (the growth: stop -> the
"stopped at the checkpoint" line, decide -> "attempt 2 of", check + start -> "attempt 2 started", to the
first step). The shrink:
  detect + tear down   the cut -> fsdpctl's FAILED line (the node timeout)
  decide               -> the "attempt 2 of 2" line (the newest checkpoint found)
  re-check + start     -> "attempt 2 started" (the lost host's re-check fails, the N-1 are checked, started)
  to the first step    -> the first `step=` line (rendezvous, imports, data, model, the checkpoint, a step)
Run as root: .venv/bin/python bench/elastic_recovery.py --nodes 3 [--repeats 3]
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

BATCH = 16
TRAIN = ("train:\n  preset: tiny\n  steps: 14\n  batch_size: {batch}\n  grad_accum: {accum}\n  seq_len: 128\n"
         "  log_interval: 1\n  eval_interval: 0\n  eval_steps: 1\n  vocab_size: 2000\n  checkpoint_interval: 5\n")
NODE_TIMEOUT = 5
PHASES = ("detect + tear down", "decide", "re-check + start", "to the first step")
GROW_PHASES = ("stop", "decide", "check + start", "to the first step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3, help="the run's full size")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    names = [f"n{i}" for i in range(1, args.nodes + 1)]
    left, victim = names[:-1], names[-1]
    root, lab = start_lab(f"elastic_recovery_{args.nodes}", tuple(names))
    try:
        from fsdpctl.workload.elastic import split_global_batch

        batch, accum = split_global_batch(BATCH * args.nodes, len(left), BATCH)
        elastic = (f"max_restarts: 1\nelastic:\n  min_nodes: {len(left)}\n"
                   + TRAIN.format(batch=BATCH, accum=1))
        profile = root / "stretchy.yaml"
        profile.write_text(lab.profile_yaml(names, python=sys.executable, name="stretchy") + elastic)
        fewer = root / "fewer.yaml"  # the same global batch, started fresh on the hosts left
        fewer.write_text(lab.profile_yaml(left, python=sys.executable, name="fewer") + TRAIN.format(batch=batch,
                                                                                                   accum=accum))
        whole = root / "whole.yaml"
        whole.write_text(lab.profile_yaml(names, python=sys.executable, name="whole") + TRAIN.format(batch=BATCH,
                                                                                                   accum=1))
        env = fsdpctl_env(root)
        fsdpctl = [sys.executable, "-m", "fsdpctl"]
        phases: dict[str, list[float]] = {name: [] for name in PHASES}
        grow_phases: dict[str, list[float]] = {name: [] for name in GROW_PHASES}
        cut = ["ip", "-n", lab.hosts[victim].namespace, "link", "set", "eth0"]
        victim_address = lab.hosts[victim].address
        # How long after the rank printed its first step the launcher showed it (the step's row, on the node)
        shown_late: dict[str, list[float]] = {"shrink": [], "grow": []}
        clock_offset = time.time() - time.perf_counter()

        def line_lag(run_dir: Path, step: int, shown: float) -> float:
            rows = [json.loads(line) for line in (root / "work" / "runs" / run_dir.name / "metrics.jsonl")
                    .read_text().splitlines() if line.startswith("{")]
            printed = max(r["time"] for r in rows if r.get("kind") == "train" and r.get("step") == step)
            return shown + clock_offset - printed

        def launched(state: Path, *extra: str) -> tuple[subprocess.Popen, Lines, Path]:
            before = set((root / "runs").glob("*")) if (root / "runs").exists() else set()
            process = subprocess.Popen(lab.in_client([*fsdpctl, "launch", "-p", str(profile), *extra]),
                                       env={**env, "FSDPCTL_STATE_DIR": str(state)}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
            lines = Lines(process)
            lines.wait_for(r"step=1 loss=")
            return process, lines, next(iter(set((root / "runs").glob("*")) - before))

        def shrunk() -> float:
            state = root / f"state-{time.monotonic_ns()}"  # no exclusion left over from the last repeat
            process, lines, run_dir = launched(state, "--node-timeout", str(NODE_TIMEOUT))
            lines.wait_for(r"step=6 loss=")
            subprocess.run([*cut, "down"], check=True)
            try:
                down = time.perf_counter()
                failed = lines.wait_for(r"^fsdpctl: run \S+ FAILED:", down)
                decided = lines.wait_for(r"^fsdpctl: attempt 2 of 2 from step 5 ", down)
                started = lines.wait_for(rf"^fsdpctl: run \S+ attempt 2 started on {len(left)} node", down)
                first = lines.wait_for(r"step=6 loss=", started)
                if process.wait(timeout=300) != 0:
                    raise SystemExit(f"the elastic run failed (exit {process.returncode})")
            finally:
                subprocess.run([*cut, "up"], check=True)
            resize = json.loads((run_dir / "run.json").read_text()).get("resize") or {}
            if resize.get("nodes") != len(left):
                raise SystemExit(f"attempt 2 did not run on {len(left)} nodes: {resize}")
            for name, seconds in zip(PHASES, (failed - down, decided - failed, started - decided, first - started),
                                     strict=True):
                phases[name].append(seconds)
            shown_late["shrink"].append(line_lag(run_dir, 6, first))
            return first - down

        def grown() -> float:
            state = root / f"state-{time.monotonic_ns()}"
            excluded = subprocess.run(lab.in_client([*fsdpctl, "hosts", "-p", str(profile), "--exclude",
                                                     victim_address]),
                                      env={**env, "FSDPCTL_STATE_DIR": str(state)}, capture_output=True, text=True)
            if excluded.returncode:
                raise SystemExit(f"hosts --exclude failed: {excluded.stderr}")
            process, lines, run_dir = launched(state)  # its first step logged
            restored = subprocess.run(lab.in_client([*fsdpctl, "hosts", "-p", str(profile), "--restore",
                                                     victim_address]),
                                      env={**env, "FSDPCTL_STATE_DIR": str(state)}, capture_output=True, text=True)
            if restored.returncode:
                raise SystemExit(f"hosts --restore failed: {restored.stderr}")
            # the first checkpoint after the host's re-check (step 5, or 10 where the steps outran it)
            stopped, grew_at = lines.wait_for_match(r"stopped at the checkpoint of step (\d+) to grow back")
            step = grew_at.group(1)
            with lines.lock:
                saved = max(at for at, line in lines.seen if at <= stopped and f"checkpoint step={step} saved" in line)
            decided = lines.wait_for(rf"^fsdpctl: attempt 2 of \d+ from step {step} ", saved)
            started = lines.wait_for(rf"^fsdpctl: run \S+ attempt 2 started on {args.nodes} node", saved)
            first = lines.wait_for(rf"step={int(step) + 1} loss=", started)
            for name, seconds in zip(GROW_PHASES, (stopped - saved, decided - stopped, started - decided,
                                                   first - started), strict=True):
                grow_phases[name].append(seconds)
            shown_late["grow"].append(line_lag(run_dir, int(step) + 1, first))
            if process.wait(timeout=300) != 0:
                raise SystemExit(f"the growing run failed (exit {process.returncode})")
            return first - saved

        cases = {
            f"shrink: {args.nodes} -> {len(left)} nodes, link cut -> first step": shrunk,
            f"fresh start by hand on {len(left)} nodes": lambda: fresh_by_hand(root, lab, fewer, left, env),
            f"grow: {len(left)} -> {args.nodes} nodes, checkpoint -> first step": grown,
            f"fresh start by hand on {args.nodes} nodes": lambda: fresh_by_hand(root, lab, whole, names, env),
        }
        samples = interleaved(cases, repeats=args.repeats, warmup=1)
        for values in (*phases.values(), *grow_phases.values()):
            del values[0]  # the warm-up's
        shrink_case, fewer_case, grow_case, whole_case = cases
        median = {name: statistics.median(values) for name, values in samples.items()}
        shrink_ratio = (median[shrink_case] - NODE_TIMEOUT) / median[fewer_case]
        grow_ratio = median[grow_case] / median[whole_case]
        where = {name: statistics.median(values) for name, values in phases.items()}
        grow_where = {name: statistics.median(values) for name, values in grow_phases.items()}
        report(f"elastic_recovery_{args.nodes}", fewer_case, summarize(samples, fewer_case),
               {"goal": "shrink - node timeout <= 1.2 x a fresh start on the nodes left; grow <= 1.2 x a fresh "
                        "start on all of them", "node_timeout_s": NODE_TIMEOUT,
                "shrink_beyond_node_timeout_over_fresh": shrink_ratio, "grow_over_fresh": grow_ratio,
                "shrink_phases_median_s": where, "shrink_phases_s": phases,
                "grow_phases_median_s": grow_where, "grow_phases_s": grow_phases,
                "first_step_shown_after_its_print_s": shown_late})
        for name, seconds in where.items():
            print(f"  shrink: {name:20s} {seconds:6.2f} s")
        for name, seconds in grow_where.items():
            print(f"  grow:   {name:20s} {seconds:6.2f} s")
        for name, lags in shown_late.items():
            print(f"  {name}: the first step shown {statistics.median(lags[1:]):.2f} s after rank 0 printed it")
        print(f"  shrink: (recovery - node timeout) / fresh start on {len(left)} = {shrink_ratio:.2f} (goal <= 1.2)")
        print(f"  grow: checkpoint -> first step / fresh start on {args.nodes} = {grow_ratio:.2f} (goal <= 1.2)")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
