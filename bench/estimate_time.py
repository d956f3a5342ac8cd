"""How long `fsdpctl estimate` takes, and the host memory its trace needs (goal: under 15 s for
gpt2-124m at world 8 and for a ~1B model on this machine).

Each case is one trace process (``python -m fsdpctl.workload.estimate``), timed whole and its peak
resident memory read from the kernel (``wait4``); the baseline is ``python -c "import torch"`` in
the same run, the floor any trace pays. Also the whole command with its choice table (its traces
side by side, and the largest batch) for gpt2-124m on 1 x 80 GiB and 8 x 80 GiB, and with
``--before DIR`` the same commands of another checkout of fsdpctl (e.g. the commit before),
interleaved with this tree's, medians of ``--repeats``.

    .venv/bin/python bench/estimate_time.py [--repeats 2] [--before DIR] [--table-only]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from harness import RESULTS, machine  # noqa: E402

GPT_1B = ("bench_models:gpt_1b", "Block", ["B", 1024])
CASES = {
    "gpt2-124m, world 8 (FSDP2 full, bf16, batch 32 x 1024)": {"preset": "gpt2-124m", "world": 8, "seq_len": 1024},
    "gpt2-124m, world 8, FSDP1": {"preset": "gpt2-124m", "world": 8, "fsdp": 1, "seq_len": 1024},
    "GPT 1.4B (24 x 2048), world 8, batch 8 x 1024": {
        "model": GPT_1B[0], "wrap": GPT_1B[1], "input_shape": GPT_1B[2], "input_dtype": "int64",
        "input_max": 50304, "batch_size": 8, "world": 8},
    "GPT 1.4B (24 x 2048), world 64 (8 nodes), batch 8 x 1024": {
        "model": GPT_1B[0], "wrap": GPT_1B[1], "input_shape": GPT_1B[2], "input_dtype": "int64",
        "input_max": 50304, "batch_size": 8, "world": 64, "local_world": 8},
}


def env(tree: Path = REPO) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(HERE), os.environ.get("PYTHONPATH", "")]))


def table(ranks: int, tree: Path) -> tuple[float, dict]:
    """The whole command, every choice and the largest batch, for gpt2-124m on ``ranks`` x 80 GiB."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fsdpctl", "estimate", "--preset", "gpt2-124m", "--seq-len", "1024",
                           "--nproc-per-node", str(ranks), "--gpu-mem", "80GiB", "--json"],
                          capture_output=True, text=True, env=env(tree), check=True, cwd=tree)
    return time.perf_counter() - start, json.loads(done.stdout)


def timed(argv: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak resident MiB and stdout of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env(), text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"estimate_time: {argv[:4]} failed")
    return seconds, usage.ru_maxrss // 1024, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", default="", help="another checkout of fsdpctl, measured beside this one")
    parser.add_argument("--table-only", action="store_true", help="only the whole commands")
    args = parser.parse_args()
    floor = min(timed([sys.executable, "-c", "import torch"])[0] for _ in range(args.repeats))
    cases: dict[str, dict] = {}
    print(f"estimate_time (baseline: python -c 'import torch', {floor:.2f} s)")
    for name, request in ({} if args.table_only else CASES).items():
        runs = []
        for _ in range(args.repeats):
            seconds, rss, out = timed([sys.executable, "-m", "fsdpctl.workload.estimate",
                                       json.dumps({"device": "cuda", **request})])
            result = json.loads(next(line for line in out.splitlines()
                                     if line.startswith("fsdpctl.estimate: ")).split(": ", 1)[1])
            assert result["traced"], result
            runs.append((seconds, rss, result))
        seconds = sorted(r[0] for r in runs)[len(runs) // 2]
        rss = max(r[1] for r in runs)
        result = runs[0][2]
        cases[name] = {"median_s": seconds, "trace_s": result["seconds"], "ratio_to_baseline": seconds / floor,
                       "peak_rss_mib": rss, "params": result["params"],
                       "peak_gib_per_gpu": result["peak_bytes"] / 2**30, "phase": result["phase"]}
        print(f"  {name:58s} {seconds:6.2f} s (trace {result['seconds']:.2f} s), host {rss} MiB; "
              f"{result['params'] / 1e6:.0f}M params, peak {result['peak_bytes'] / 2**30:.2f} GiB/GPU")
    trees = {"this tree": REPO, **({f"before ({args.before})": Path(args.before)} if args.before else {})}
    for ranks in (1, 8):
        times: dict[str, list[float]] = {label: [] for label in trees}
        answers: dict[str, dict] = {}
        for _ in range(args.repeats):
            for label, tree in trees.items():  # interleaved: the machine's drift falls on both alike
                seconds, answers[label] = table(ranks, tree)
                times[label].append(seconds)
        for label in trees:
            median = sorted(times[label])[len(times[label]) // 2]
            found = answers[label]
            cases[f"gpt2-124m, {ranks} x 80 GiB, the whole choice table, {label}"] = {
                "median_s": median, "runs_s": times[label], "ratio_to_baseline": median / floor,
                "traced_choices": sum(c["traced"] for c in found["choices"]), "best": found["best"]["sharding"],
                "max_batch": found["max_batch"], "max_batch_peak_bytes": found["max_batch_peak_bytes"]}
            print(f"  gpt2-124m on {ranks} x 80 GiB, every choice and the largest batch, {label:28s} {median:6.2f} s "
                  f"(runs {', '.join(f'{t:.1f}' for t in times[label])}); largest batch {found['max_batch']}")
        if args.before:
            now, then = (cases[f"gpt2-124m, {ranks} x 80 GiB, the whole choice table, {label}"]["median_s"]
                         for label in trees)
            print(f"  {ranks} rank(s): this tree / before = {now / then:.2f}x")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / ("estimate_table.json" if args.table_only else "estimate_time.json")).write_text(json.dumps(
        {"baseline": "python -c 'import torch'", "baseline_s": floor, "cases": cases, "machine": machine()},
        indent=2))


if __name__ == "__main__":
    main()
