"""What fsdpctl's rank telemetry costs a user's training step: the same plain FSDP2 loop (gloo, this
machine's CPU) with the start-up hook's telemetry on and off, interleaved, each run timing its own
steps (median of the steps after the first ten), each rank on a core of its own.

  small: the loop of tests/user_scripts/fsdp2_loop.py's size (4 blocks of width 128, batch 8 x 64
         tokens), 2 ranks: the ratio a user sees
  tiny:  a model of one small block, 1 rank, a step of a few hundred microseconds: the telemetry's
         own microseconds per step stand out of the noise there
Two comparisons: runs apart (telemetry off in one, on in the next: what a user sees, within this
machine's run-to-run noise of a few percent on 2 cores), and within the same processes (the
telemetry's wrappers paused and armed in turn every PHASE steps, on every rank at the same step:
the same memory, threads and cores, so the difference is the telemetry's).
Run from the repository (no root needed):
  .venv/bin/python bench/telemetry_overhead.py [--repeats 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine  # noqa: E402

PROGRAM = """\
import os, statistics, sys, time
import torch, torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

steps, width, depth, batch, seq = (int(v) for v in sys.argv[1:6])
PHASE = {phase}
if len(os.sched_getaffinity(0)) > int(os.environ["LOCAL_WORLD_SIZE"]):
    os.sched_setaffinity(0, {int(os.environ["LOCAL_RANK"])})  # a core each: less of the scheduler's noise
dist.init_process_group("gloo")
world = dist.get_world_size()
torch.manual_seed(0)
class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(512, width), nn.Linear(width, 512)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                                  nn.Linear(4 * width, width)) for _ in range(depth))
    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)

model = LM()
mesh = init_device_mesh("cpu", (world,))
for block in model.blocks:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 512, (steps * batch, seq + 1))
loader = iter(DataLoader(TensorDataset(tokens), batch_size=batch))
installed = []
if os.environ.get("FSDPCTL_TELEMETRY") == "1":
    from fsdpctl.node.telemetry import INSTALLED as installed
times, paused, armed = [], [], []
for step in range(steps):
    if installed and step % PHASE == 0:  # every rank at the same step: phases of the telemetry paused and armed
        installed[0].patches.off = (step // PHASE) % 2 == 0
    began, cpu_began = time.perf_counter(), time.process_time()
    (chunk,) = next(loader)
    loss = F.cross_entropy(model(chunk[:, :-1]).flatten(0, 1), chunk[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    took, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    times.append(took)
    if installed and step >= 10 and step % PHASE >= 2:  # a phase's first steps settle the switch
        (paused if installed[0].patches.off else armed).append((took, cpu))
if dist.get_rank() == 0:
    print("MEDIAN", statistics.median(times[10:]), flush=True)
    if installed:  # wall and CPU (every thread of rank 0's process) per step, paused then armed
        print("PHASES", *(statistics.median(p[i] for p in phase) for i in (0, 1) for phase in (paused, armed)),
              flush=True)
dist.destroy_process_group()
"""
PHASE = 20
"""Steps per phase of the in-process comparison."""

CASES = {"small": dict(nproc=2, width=128, depth=4, batch=8, seq=64),
         "tiny": dict(nproc=1, width=16, depth=1, batch=2, seq=8)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def one_run(program: Path, run_dir: Path, case: dict, steps: int, telemetry: bool) -> tuple[float, tuple]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FSDPCTL_RUN_DIR": str(run_dir),
           "FSDPCTL_TELEMETRY": "1" if telemetry else "0",
           "PYTHONPATH": os.pathsep.join([str(REPO / "fsdpctl" / "node" / "startup"), str(REPO)])}
    argv = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", "1", "--nproc-per-node", str(case["nproc"]),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(program), str(steps),
            str(case["width"]), str(case["depth"]), str(case["batch"]), str(case["seq"])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    medians = [float(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("MEDIAN")]
    phases = [tuple(map(float, line.split()[1:])) for line in done.stdout.splitlines() if line.startswith("PHASES")]
    if done.returncode or not medians:
        raise SystemExit(f"the loop failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return medians[0], phases[0] if phases else ()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--only", choices=sorted(CASES), action="append", help="only this case (repeatable)")
    args = parser.parse_args()
    cases = {name: case for name, case in CASES.items() if not args.only or name in args.only}
    results = {}
    with tempfile.TemporaryDirectory(prefix="fsdpctl-bench-telemetry-") as folder:
        program = Path(folder) / "loop.py"
        program.write_text(PROGRAM.replace("{phase}", str(PHASE)))
        for name, case in cases.items():
            samples: dict[str, list[float]] = {"off": [], "on": []}
            phases: list[tuple] = []
            for repeat in range(args.repeats + 1):  # the first round warms the caches and is dropped
                for setting in ("off", "on"):
                    run_dir = Path(folder) / f"{name}-{setting}-{repeat}"
                    run_dir.mkdir()
                    seconds, phased = one_run(program, run_dir, case, args.steps, setting == "on")
                    if repeat:
                        samples[setting].append(seconds)
                        phases += [phased] if phased else []
            off, on = statistics.median(samples["off"]), statistics.median(samples["on"])
            pairs = [b / a for a, b in zip(samples["off"], samples["on"], strict=True)]
            within = [armed / paused for paused, armed, _, _ in phases]
            us_within = statistics.median((armed - paused) * 1e6 for paused, armed, _, _ in phases)
            cpu_us = statistics.median((armed - paused) * 1e6 for _, _, paused, armed in phases)
            results[name] = {"case": case, "step_s_off": off, "step_s_on": on, "ratio": on / off,
                             "paired_ratio_median": statistics.median(pairs), "us_per_step": (on - off) * 1e6,
                             "in_process_ratio_median": statistics.median(within),
                             "in_process_us_per_step": us_within, "in_process_cpu_us_per_step": cpu_us,
                             "samples": samples, "phases": phases}
            print(f"{name:6s} runs apart: step {off * 1e3:8.3f} ms off, {on * 1e3:8.3f} ms on: {on / off:.4f}x "
                  f"(paired median {statistics.median(pairs):.4f}x); in the same processes, armed / paused: "
                  f"{statistics.median(within):.4f}x, {us_within:+.1f} us per step (CPU of rank 0's process: "
                  f"{cpu_us:+.1f} us)", flush=True)
    if "small" in results and "tiny" in results:
        small, tiny = results["small"], results["tiny"]
        print(f"\nthe telemetry's own cost, from the tiny step in the same processes: "
              f"{tiny['in_process_us_per_step']:.1f} us per step, "
              f"{tiny['in_process_us_per_step'] / 1e6 / small['step_s_off']:.2%} of the small loop's step; the small "
              f"loop armed / paused: {small['in_process_ratio_median']:.4f}x (goal <= 1.01)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"telemetry_overhead{'_' + '_'.join(args.only) if args.only else ''}.json").write_text(json.dumps(
        {"benchmark": "telemetry_overhead", "baseline": "telemetry off", "cases": results,
         "repeats": args.repeats, "steps": args.steps, "machine": machine()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
