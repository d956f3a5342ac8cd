"""GPU figures of the bundled workload against a plain single-GPU loop of the same model, same run.

Cases (``--cases``, comma-separated):
- ``ref``, ``ref+compile``: bench/gpu_reference.py, the same GPT without FSDP (the ceiling);
- ``fsdp2``, ``fsdp2+compile``, ``fsdp1``, ``fsdp1+compile``: the workload itself under torchrun,
  one process per GPU, gpt2-124m in bf16, no evaluation or checkpoint inside the timed steps.

For each: tokens/s (median log window), MFU, peak memory per rank, the spread between log windows
((max - min) / median, the first window left out), and the ratios the goals are stated in:
fsdp2 / ref and fsdp2+compile / ref+compile (goal >= 0.9), compile / eager (goal >= 1.15), fsdp2 /
fsdp1 (goal >= 1). ``--workload-path DIR`` runs the workload from another tree (an older version:
``--legacy`` for one without ``--model-vocab-size``). ``--collectives`` adds ``fsdpctl doctor -p
local-gpu --collectives``. Without a CUDA device it writes a result saying so and exits 0.

Run: python bench/gpu_workload.py [--batch-size 32] [--model-vocab-size 50304] [--steps 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine  # noqa: E402

RATIOS = [("fsdp2 / ref", "fsdp2", "ref", 0.9), ("fsdp2+compile / ref+compile", "fsdp2+compile", "ref+compile", 0.9),
          ("fsdp2+compile / fsdp2", "fsdp2+compile", "fsdp2", 1.15), ("fsdp2 / fsdp1", "fsdp2", "fsdp1", 1.0),
          ("fsdp2+compile / fsdp1+compile", "fsdp2+compile", "fsdp1+compile", 1.0)]


def spread(values: list[float]) -> float | None:
    """(max - min) / median of the windows after the first (warm-up, compilation)."""
    steady = [v for v in values[1:] if v]
    return (max(steady) - min(steady)) / statistics.median(steady) if len(steady) >= 2 else None


def summary_row(run_dir: Path) -> dict:
    """One workload run's figures from its summary.json and metrics.jsonl. Keys are read strictly:
    a renamed key fails here instead of turning into a null figure."""
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [r["tokens_per_s"] for r in rows if r["kind"] == "train"]
    return {
        "tokens_per_s": summary["median_tokens_per_s"],
        "mfu": summary["median_mfu"],  # null on a device whose peak FLOP/s the workload does not know
        "peak_memory_mb_per_rank": summary["peak_memory_mb_per_rank"],
        "window_tokens_per_s": [round(w) if w else None for w in windows],
        "window_spread": spread(windows),
        "time_to_first_step_s": summary["time_to_first_step_s"],
        "final_train_loss": summary["final_train_loss"],
        "model_vocab_size": summary["model_config"]["vocab_size"],
        "batch_size": summary["tokens_per_step"] // summary["world_size"] // 1024,
    }


def run_reference(args, compile_: bool) -> dict:
    argv = [sys.executable, str(REPO / "bench" / "gpu_reference.py"), "--batch-size", str(args.batch_size),
            "--model-vocab-size", str(args.model_vocab_size), "--steps", str(args.steps),
            *(["--compile"] if compile_ else [])]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["window_spread"] = spread([None, *row["window_tokens_per_s"]])
    row["peak_memory_mb_per_rank"] = [row.pop("peak_memory_mb")]
    return row


def run_workload(args, gpus: int, fsdp: str, compile_: bool) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"fsdpctl-gpu-fsdp{fsdp}-"))
    vocab = ["--vocab-size", "5000"] if args.legacy else ["--model-vocab-size", str(args.model_vocab_size)]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            "-m", "fsdpctl.workload.train", "--preset", "gpt2-124m", "--mixed-precision", "bf16",
            "--fsdp", fsdp, "--steps", str(args.steps), "--batch-size", str(args.batch_size),
            "--seq-len", "1024", "--eval-interval", "0", "--no-checkpoint", "--run-dir", str(run_dir),
            "--log-interval", "10", *vocab, *(["--compile"] if compile_ else []), *args.workload_flags.split()]
    # Started from the run directory: `python -m` puts the current folder first on sys.path, ahead of
    # PYTHONPATH, so starting in this checkout would run its workload whatever --workload-path says.
    tree = Path(args.workload_path).resolve() if args.workload_path else REPO
    env = {**os.environ, "OMP_NUM_THREADS": "8",
           "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(argv, cwd=run_dir, capture_output=True, text=True, timeout=args.timeout, env=env)
    if done.returncode != 0:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    return summary_row(run_dir)


def gpu_count() -> int:
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    return int(done.stdout.strip() or 0)


def print_table(label: str, rows: dict) -> None:
    print(f"\n{label}")
    print(f"{'case':16s} {'tok/s':>9s} {'MFU':>7s} {'peak MiB':>9s} {'spread':>7s}")
    for name, row in rows.items():
        if "error" in row:
            print(f"{name:16s} FAILED: {row['error'].splitlines()[-1] if row['error'] else '?'}")
            continue
        mfu = f"{row['mfu'] * 100:.1f}%" if row.get("mfu") else "n/a"
        sp = f"{row['window_spread'] * 100:.1f}%" if row.get("window_spread") is not None else "n/a"
        print(f"{name:16s} {row['tokens_per_s']:9.0f} {mfu:>7s} {max(row['peak_memory_mb_per_rank']):9.0f} {sp:>7s}")


def ratios(rows: dict) -> dict:
    out = {}
    for label, top, bottom, goal in RATIOS:
        if "tokens_per_s" in rows.get(top, {}) and "tokens_per_s" in rows.get(bottom, {}):
            value = rows[top]["tokens_per_s"] / rows[bottom]["tokens_per_s"]
            out[label] = {"ratio": round(value, 3), "goal": goal, "met": value >= goal}
            print(f"{label:32s} {value:6.3f}  (goal >= {goal})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="ref,ref+compile,fsdp2,fsdp2+compile,fsdp1")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model-vocab-size", type=int, default=50304)
    parser.add_argument("--workload-path", help="run the workload from this tree (PYTHONPATH)")
    parser.add_argument("--legacy", action="store_true", help="that tree predates --model-vocab-size")
    parser.add_argument("--workload-flags", default="", help="more flags for every workload case")
    parser.add_argument("--label", default="workload")
    parser.add_argument("--collectives", action="store_true")
    parser.add_argument("--timeout", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    gpus = gpu_count()
    if gpus == 0:
        note = "skipped: no CUDA device on this machine"
        print(f"gpu_workload: {note}")
        args.out.write_text(json.dumps({"benchmark": "gpu", "skipped": note, "machine": machine()}, indent=2) + "\n")
        return
    rows: dict[str, dict] = {}
    for case in args.cases.split(","):
        compile_ = case.endswith("+compile")
        base = case.removesuffix("+compile")
        rows[case] = (run_reference(args, compile_) if base == "ref"
                      else run_workload(args, gpus, base.removeprefix("fsdp"), compile_))
        print(f"gpu_workload[{args.label}] {case}: {json.dumps(rows[case])}", flush=True)
    result = {"benchmark": "gpu", "label": args.label, "gpus": gpus, "batch_size": args.batch_size,
              "model_vocab_size": args.model_vocab_size, "steps": args.steps, "runs": rows}
    if args.collectives:
        done = subprocess.run([sys.executable, "-m", "fsdpctl", "doctor", "-p", "local-gpu", "--collectives",
                               "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
        try:
            result["collectives"] = json.loads(done.stdout).get("collectives")
        except ValueError:
            result["collectives"] = {"error": (done.stdout + done.stderr)[-1500:]}
    print_table(f"{args.label}: batch {args.batch_size}, model vocab {args.model_vocab_size}, {gpus} GPU(s)", rows)
    result["ratios"] = ratios(rows)
    result["machine"] = machine()
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
