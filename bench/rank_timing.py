"""Per-rank timings and `fsdpctl report`: what they cost.

1. The bundled workload's step time with the per-rank timings on (the default) against off
   (``--set rank_timing=false``): 2 ranks on this machine, interleaved off/on/off runs, medians of
   each run's median step time; the two "off" series against each other give the noise floor.
   Goal: on/off within 1.02x or within that noise.
2. `fsdpctl report RUN --no-fetch --plot DIR` end to end (the CLI's start included) on a run whose
   metrics.jsonl holds 10,000 steps x 16 ranks (generated; the run itself is a real 2-step local
   run); baseline: `python -c pass`. Goal: under 3 s.

    .venv/bin/python bench/rank_timing.py [--repeats 4] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from harness import RESULTS, machine  # noqa: E402

FSDPCTL = str(REPO / ".venv" / "bin" / "fsdpctl")


def workload_step(run_dir: Path, steps: int, timing: bool) -> float:
    argv = [FSDPCTL, "launch", "-p", "local", "--nproc-per-node", "2", "--preset", "tiny", "--steps", str(steps),
            "--batch-size", "8", "--set", "seq_len=128", "--set", "eval_interval=0", "--set", "no_checkpoint=true",
            "--set", f"rank_timing={'true' if timing else 'false'}", "--no-preflight"]
    env = dict(os.environ, FSDPCTL_RUNS_DIR=str(run_dir))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=run_dir)
    if done.returncode != 0:
        raise SystemExit(f"rank_timing: the workload failed:\n{done.stderr[-2000:]}")
    newest = max(run_dir.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    summary = json.loads(newest.read_text())
    return float(summary["median_step_time_s"])


def synthetic_metrics(path: Path, steps: int, ranks: int) -> None:
    rng = random.Random(0)
    with path.open("w") as out:
        for step in range(1, steps + 1):
            entry = [{"rank": r, "node": r // 8, "host": f"10.0.0.{r // 8 + 1}",
                      "compute_s": 0.05 * rng.uniform(0.97, 1.03) * (1.3 if r == 11 else 1.0), "comm_s": 0.01,
                      "data_s": 0.001, "wall_s": 0.07, "mem_mb": 30000.0 + r} for r in range(ranks)]
            out.write(json.dumps({"kind": "train", "step": step, "loss": 10.0 / (1 + step / 1000), "lr": 3e-4,
                                  "tokens_per_s": 480000.0, "mfu": 0.40, "mem_mb": 30000.0, "step_time_s": 0.07,
                                  "ranks": entry}) + "\n")
            if step % 500 == 0:
                out.write(json.dumps({"kind": "val", "step": step, "val_loss": 10.0 / (1 + step / 1000)}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-timing-"))
    off, on, off2 = [], [], []
    for i in range(args.repeats):
        order = [(off, False), (on, True), (off2, False)] if i % 2 == 0 else [(on, True), (off2, False), (off, False)]
        for series, timing in order:
            series.append(workload_step(work, args.steps, timing))
    step = {"off_s": statistics.median(off), "on_s": statistics.median(on), "off_again_s": statistics.median(off2)}
    step["on_over_off"] = step["on_s"] / step["off_s"]
    step["noise_off_over_off"] = step["off_again_s"] / step["off_s"]
    step["spread_off"] = (max(off + off2) - min(off + off2)) / statistics.median(off + off2)
    print(f"workload step (tiny, 2 ranks, {args.steps} steps x {args.repeats}): off {step['off_s'] * 1000:.1f} ms, "
          f"on {step['on_s'] * 1000:.1f} ms, off again {step['off_again_s'] * 1000:.1f} ms; on/off "
          f"{step['on_over_off']:.3f}, off/off {step['noise_off_over_off']:.3f}, spread of the off runs "
          f"{step['spread_off']:.1%}")

    # A real run to report on, its metrics replaced by 10,000 steps x 16 ranks.
    newest = max((p for p in work.glob("local-*") if (p / "run.json").exists()), key=lambda p: p.stat().st_mtime)
    fetched = newest / "fetched" / "node0"
    fetched.mkdir(parents=True, exist_ok=True)
    synthetic_metrics(fetched / "metrics.jsonl", 10_000, 16)
    size = (fetched / "metrics.jsonl").stat().st_size
    env = dict(os.environ, FSDPCTL_RUNS_DIR=str(work))
    floor = min(_timed([sys.executable, "-c", "pass"], env, work) for _ in range(3))
    plain = [_timed([FSDPCTL, "report", newest.name, "--no-fetch"], env, work) for _ in range(3)]
    plotted = [_timed([FSDPCTL, "report", newest.name, "--no-fetch", "--plot", str(work / "plots")], env, work)
               for _ in range(3)]
    report = {"metrics_bytes": size, "steps": 10_000, "ranks": 16, "floor_s": floor,
              "report_s": statistics.median(plain), "report_plot_s": statistics.median(plotted)}
    print(f"fsdpctl report, 10,000 steps x 16 ranks ({size / 1e6:.1f} MB of metrics): {report['report_s']:.2f} s, "
          f"with --plot {report['report_plot_s']:.2f} s (python -c pass {floor:.3f} s)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "rank_timing.json").write_text(json.dumps(
        {"goal": "on/off within 1.02x or the noise; report on 10k steps x 16 ranks < 3 s", "workload_step": step,
         "report": report, "machine": machine()}, indent=2))


def _timed(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"rank_timing: {argv[1:3]} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
