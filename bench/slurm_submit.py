"""Submit-to-first-step through Slurm on the namespace testbed (munge, slurmctld, two slurmd).

  A: `fsdpctl submit --slurm -p lab` (plan, render, ship the workload, sbatch)
  A': the same with `--via submitit`
  B (baseline): the same job typed as a hand-written sbatch script (the lines a user would write:
     head node address, exports, one torchrun per node through srun), submitted with `sbatch`
Each measured from the start of the command to the first `step=` line in a node's log; the job is
let finish before the next sample (interleaved A A' B, repeated). No goal was set; the figure is
for the closing note. Run as root: .venv/bin/python bench/slurm_submit.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, summarize  # noqa: E402

from fsdpctl.workload.config import to_argv  # noqa: E402
from tests.testbed.lab import Lab, netns_available  # noqa: E402
from tests.testbed.slurm import SlurmCluster, slurm_available  # noqa: E402

TRAIN = {"preset": "tiny", "steps": 3, "batch_size": 4, "seq_len": 64, "log_interval": 1, "eval_interval": 0,
         "eval_steps": 1, "vocab_size": 2000, "no_checkpoint": True}

HAND_WRITTEN = """#!/bin/bash
#SBATCH --job-name=by-hand
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=10
#SBATCH --output={dir}/slurm-%j.out
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol show node "$head" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 NCCL_IB_DISABLE=1
export PYTHONPATH={dir}/pkg
srun bash -c "cd {dir} && exec {python} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 \\
  --rdzv-id \\$SLURM_JOB_ID --rdzv-backend c10d --rdzv-endpoint $addr:29400 \\
  -m fsdpctl.workload.train {args} > node\\$SLURM_NODEID.log 2>&1"
"""


def wait_first_step(folder: Path, started: float, timeout: float = 300) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in folder.glob("node*.log"):
            if "step=" in log.read_text(errors="replace"):
                return time.perf_counter() - started
        time.sleep(0.02)
    raise SystemExit(f"no training step in {folder} within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reason = netns_available() or slurm_available()
    if reason:
        sys.exit(f"slurm_submit: the Slurm testbed {reason}")
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-slurm-"))
    lab = Lab(root, ["n1", "n2"]).up()
    cluster = None
    try:
        cluster = SlurmCluster(lab, ["n1", "n2"]).up()
        work = root / "work"
        profile = root / "lab.yaml"
        profile.write_text(f"name: lab\nbackend: slurm\ndevice: cpu\nnproc_per_node: 1\npython: {sys.executable}\n"
                           f"workdir: {work}\nnetwork:\n  interface: eth0\nslurm:\n  nodes: 2\n  time: \"10\"\n"
                           "train:\n" + "".join(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}\n"
                                                for k, v in TRAIN.items()))
        env = {**os.environ, **cluster.env, "HOME": str(root), "FSDPCTL_RUNS_DIR": str(root / "runs"),
               "PYTHONPATH": str(REPO)}

        def idle() -> None:
            deadline = time.monotonic() + 120
            while subprocess.run(cluster.client(["squeue", "-h"]), capture_output=True, text=True,
                                 env=env).stdout.strip():
                if time.monotonic() > deadline:
                    raise SystemExit("a job did not end")
                time.sleep(0.1)

        def by_fsdpctl(*extra: str) -> float:
            idle()
            started = time.perf_counter()
            done = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", "submit", "--slurm", "-p",
                                                 str(profile), *extra]),
                                  env=env, capture_output=True, text=True, check=True)
            return wait_first_step(work / "runs" / done.stdout.strip(), started)

        def by_hand() -> float:
            idle()
            folder = root / "by-hand" / str(time.monotonic_ns())
            folder.mkdir(parents=True)
            (folder / "pkg").symlink_to(REPO, target_is_directory=True)
            argv = to_argv({**TRAIN, "cache_dir": str(work / "cache"), "run_dir": "."})
            script = folder / "job.sh"
            script.write_text(HAND_WRITTEN.format(dir=folder, python=sys.executable, args=shlex.join(argv)))
            started = time.perf_counter()
            subprocess.run(cluster.client(["sbatch", f"--chdir={folder}", str(script)]), env=env, check=True,
                           capture_output=True)
            return wait_first_step(folder, started)

        by_fsdpctl()  # the tokenizer cache, the page cache
        samples = interleaved({"fsdpctl submit --slurm": by_fsdpctl,
                               "fsdpctl submit --slurm --via submitit": lambda: by_fsdpctl("--via", "submitit"),
                               "hand-written sbatch script": by_hand},
                              repeats=args.repeats, warmup=0)
        idle()
        report("slurm_submit", "hand-written sbatch script", summarize(samples, "hand-written sbatch script"),
               {"goal": "none set; reported in the closing note", "samples": samples})
        print(json.dumps(samples))
    finally:
        if cluster is not None:
            cluster.down()
        lab.down()


if __name__ == "__main__":
    main()
