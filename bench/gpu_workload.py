"""GPU figures of the bundled workload: gpt2-124m in bf16, FSDP1 vs FSDP2, with and without compile,
and NCCL bus bandwidth from `fsdpctl doctor --collectives` on the `local-gpu` profile.

Reports tokens/s, MFU and peak memory (from each run's summary.json). Without a CUDA device it
writes a result saying so and exits 0. Run: .venv/bin/python bench/gpu_workload.py [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine  # noqa: E402

CONFIGS = [("fsdp2", "2", False), ("fsdp2+compile", "2", True), ("fsdp1", "1", False)]


def summary_row(summary: dict) -> dict:
    """One run's figures from its summary.json. Keys are read strictly: a renamed key fails here
    instead of turning into a null figure."""
    return {
        "tokens_per_s": summary["median_tokens_per_s"],
        "mfu": summary["median_mfu"],  # null on a device whose peak FLOP/s the workload does not know
        "peak_memory_mb": max(summary["peak_memory_mb_per_rank"]),
        "time_to_first_step_s": summary["time_to_first_step_s"],
        "final_train_loss": summary["final_train_loss"],
    }


def gpu_count() -> int:
    probe = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    return int(done.stdout.strip() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    gpus = gpu_count()
    if gpus == 0:
        note = "skipped: no CUDA device on this machine"
        print(f"gpu_workload: {note}")
        (RESULTS / "gpu.json").write_text(json.dumps({"benchmark": "gpu", "skipped": note, "machine": machine()},
                                                     indent=2) + "\n")
        return
    rows = {}
    for name, fsdp, compile_ in CONFIGS:
        run_dir = Path(tempfile.mkdtemp(prefix=f"fsdpctl-gpu-{name}-"))
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                "-m", "fsdpctl.workload.train", "--preset", "gpt2-124m", "--mixed-precision", "bf16",
                "--fsdp", fsdp, "--steps", str(args.steps), "--batch-size", str(args.batch_size),
                "--seq-len", str(args.seq_len), "--eval-interval", "0", "--no-checkpoint",
                "--run-dir", str(run_dir), "--log-interval", "10", *(["--compile"] if compile_ else [])]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=3600,
                              env={**os.environ, "OMP_NUM_THREADS": "8"})
        if done.returncode != 0:
            rows[name] = {"error": done.stderr[-1500:]}
            continue
        rows[name] = summary_row(json.loads((run_dir / "summary.json").read_text()))
        print(name, rows[name], flush=True)
    collectives = subprocess.run([sys.executable, "-m", "fsdpctl", "doctor", "-p", "local-gpu", "--collectives",
                                  "--json"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    try:
        bandwidth = json.loads(collectives.stdout).get("collectives")
    except ValueError:
        bandwidth = {"error": collectives.stderr[-1500:]}
    (RESULTS / "gpu.json").write_text(json.dumps({"benchmark": "gpu", "gpus": gpus, "runs": rows,
                                                  "collectives": bandwidth, "goal": "MFU >= 40% on gpt2-124m",
                                                  "machine": machine()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
