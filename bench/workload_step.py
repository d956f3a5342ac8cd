"""Benchmark of the bundled workload: step time and per-rank state bytes.

    .venv/bin/python bench/workload_step.py [--repeats 5] [--steps 40] [--preset tiny]

Every figure is a ratio against a baseline measured in this same run, from configurations run
interleaved (A B C D, B C D A, ...) and summarised by medians:

* step time of the workload (FSDP2, 2 ranks) / the bare FSDP2 loop (bench/bare_fsdp2.py); goal <= 1.05
* step time with fsdpctl's rank start-up hook armed and torch's flight recorder on (2000 entries), as
  every launch runs the ranks, / with neither (the recorder off): what diagnosing a hang costs a step
* step time FSDP1 / FSDP2 (workload, 2 ranks)
* step time world 2 / world 1 (workload FSDP2, same per-rank batch: weak scaling)
* per-rank parameter + gradient + optimizer bytes (fp32 AdamW) at world 1, 2, 4 against the
  16 bytes/param/N rule; world 2 / world 1 with --sharding full; goal <= 0.55; and each rank's peak
  memory (resident set on CPU, max_memory_allocated on a GPU)

Writes bench/results/workload.json. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = REPO / "bench" / "results" / "workload.json"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(nproc: int) -> list[str]:
    return [str(BIN / "torchrun"), "--nnodes=1", f"--nproc-per-node={nproc}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}"]


def env(run_dir: Path | None = None) -> dict[str, str]:
    """The ranks' environment; with ``run_dir``, as a launch arms them (the start-up hook first on the
    path, the flight recorder on); without, neither (the recorder off)."""
    out = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", TORCH_FR_BUFFER_SIZE="0")
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    if run_dir is not None:
        out.update(TORCH_FR_BUFFER_SIZE="2000", FSDPCTL_RUN_DIR=str(run_dir))
        out["PYTHONPATH"] = str(REPO / "fsdpctl" / "node" / "startup") + os.pathsep + out["PYTHONPATH"]
    return out


def run(cmd: list[str], hooked: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=REPO, env=env(hooked), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout


def workload(args, nproc: int, run_dir: Path, *flags: str, hooked: bool = False) -> dict:
    cmd = [*torchrun(nproc), "-m", "fsdpctl.workload.train", "--preset", args.preset,
           "--vocab-size", str(args.vocab_size), "--cache-dir", str(args.cache_dir),
           "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len),
           "--log-interval", "10", "--eval-interval", "0", "--eval-steps", "1", "--no-checkpoint",
           "--mixed-precision", "fp32", "--optimizer", "adamw", "--run-dir", str(run_dir), *flags]
    run(cmd, run_dir if hooked else None)
    return json.loads((run_dir / "summary.json").read_text())


def bare(args, nproc: int) -> float:
    out = run([*torchrun(nproc), "bench/bare_fsdp2.py", "--preset", args.preset, "--vocab-size",
               str(args.vocab_size), "--batch-size", str(args.batch_size), "--seq-len",
               str(args.seq_len), "--steps", str(args.steps), "--window", "10"])
    return json.loads(out.strip().splitlines()[-1])["median_step_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--vocab-size", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-"))
    try:
        measure(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(args, scratch: Path) -> None:
    args.cache_dir = scratch / "cache"

    # Build the tokenizer cache once, outside every timed run.
    from fsdpctl.workload import data
    corpus = data.load_builtin(args.cache_dir)
    data.build_tokens(corpus, args.vocab_size, data.cache_folder(args.cache_dir, corpus, args.vocab_size))

    steps = ["--steps", str(args.steps)]
    configs = {
        "bare_fsdp2_w2": lambda d: bare(args, 2),
        "workload_fsdp2_w2": lambda d: workload(args, 2, d, *steps, "--fsdp", "2")["median_step_time_s"],
        "workload_fsdp2_w2_hooked": lambda d: workload(args, 2, d, *steps, "--fsdp", "2",
                                                       hooked=True)["median_step_time_s"],
        "workload_fsdp1_w2": lambda d: workload(args, 2, d, *steps, "--fsdp", "1")["median_step_time_s"],
        "workload_fsdp2_w1": lambda d: workload(args, 1, d, *steps, "--fsdp", "2")["median_step_time_s"],
    }
    names = list(configs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]  # rotate: A B C D, B C D A..
        for name in order:
            seconds = configs[name](scratch / f"{name}-{repeat}")
            times[name].append(seconds)
            print(f"repeat {repeat} {name:20s} {seconds * 1e3:8.1f} ms/step", flush=True)
    median = {name: statistics.median(values) for name, values in times.items()}

    memory = {}
    for fsdp in ("2", "1"):
        for world in (1, 2, 4):
            summary = workload(args, world, scratch / f"mem-fsdp{fsdp}-w{world}", "--steps", "2",
                               "--fsdp", fsdp, "--sharding", "full")
            per_rank = max(r["total"] for r in summary["state_bytes_per_rank"])
            rule = 16 * summary["param_count"] / world
            memory[f"fsdp{fsdp}_w{world}"] = {"max_state_bytes_per_rank": per_rank,
                                              "rule_16_bytes_per_param_over_n": rule,
                                              "vs_rule": per_rank / rule,
                                              "per_rank": summary["state_bytes_per_rank"],
                                              # peak RSS on CPU, max_memory_allocated on a GPU
                                              "peak_memory_mb_per_rank": summary["peak_memory_mb_per_rank"]}
            print(f"fsdp{fsdp} world {world}: {per_rank / 2**20:7.2f} MiB/rank "
                  f"(rule {rule / 2**20:7.2f} MiB, x{per_rank / rule:.3f}), peak memory "
                  f"{max(summary['peak_memory_mb_per_rank']):.0f} MB/rank", flush=True)

    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "settings": {k: str(v) for k, v in vars(args).items() if k != "cache_dir"},
        "step_time_s": {"samples": times, "median": median},
        "ratios": {
            "workload_over_bare_fsdp2": median["workload_fsdp2_w2"] / median["bare_fsdp2_w2"],
            "fsdp1_over_fsdp2": median["workload_fsdp1_w2"] / median["workload_fsdp2_w2"],
            "hooked_over_plain": median["workload_fsdp2_w2_hooked"] / median["workload_fsdp2_w2"],
            "world2_over_world1_step_time": median["workload_fsdp2_w2"] / median["workload_fsdp2_w1"],
            "world2_over_world1_tokens_per_s":
                2 * median["workload_fsdp2_w1"] / median["workload_fsdp2_w2"],
            "state_bytes_world2_over_world1_fsdp2_full":
                memory["fsdp2_w2"]["max_state_bytes_per_rank"]
                / memory["fsdp2_w1"]["max_state_bytes_per_rank"],
            "state_bytes_world2_over_world1_fsdp1_full":
                memory["fsdp1_w2"]["max_state_bytes_per_rank"]
                / memory["fsdp1_w1"]["max_state_bytes_per_rank"],
        },
        "state_bytes": memory,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, RESULTS)
    print(json.dumps(result["ratios"], indent=2))
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
