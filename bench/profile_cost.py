"""What on-demand profiling costs a training step (``fsdpctl profile``, ``launch --profile-steps``).

  idle:     every step of every rank calls ``fsdpctl.node.profiling.step_ended`` whether or not a
            profile is asked for. Its cost while none is (nanoseconds a call, against a call of an
            empty function measured alike), as a share of the small loop's step.
  profiled: the steps torch.profiler records, against the same rank's steps just before them, in
            a plain FSDP2 loop (gloo, this machine's CPU, 2 ranks, a core each), K = 3 steps profiled
            at 3 places of each run, over several runs; and the trace's size.
Run from the repository (no root needed):
  .venv/bin/python bench/profile_cost.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))
from harness import RESULTS, machine  # noqa: E402

PROGRAM = """\
import os, sys, time
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from fsdpctl.node import profiling

steps = int(sys.argv[1])
if len(os.sched_getaffinity(0)) > int(os.environ["LOCAL_WORLD_SIZE"]):
    os.sched_setaffinity(0, {int(os.environ["LOCAL_RANK"])})
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)) for _ in range(4)])
for block in model:
    fully_shard(block)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(1, steps + 1):
    x = torch.randn(8 * 64, 128)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    profiling.step_ended(step)
    if step in (40, 80):  # the next places to profile, asked as fsdpctl's pipe would
        profiling.request('{"id": "at%d", "start": %d, "steps": 3}' % (step + 10, step + 10))
dist.destroy_process_group()
"""


def idle_ns() -> dict[str, float]:
    """Nanoseconds per call of the idle check, and of an empty function, best of 7 timings of 1e6 calls."""
    from fsdpctl.node import profiling

    def empty(number: int) -> None:
        return None

    profiling._SESSION = None
    check = min(timeit.repeat(lambda: profiling.step_ended(5), number=1_000_000, repeat=7)) * 1e3
    base = min(timeit.repeat(lambda: empty(5), number=1_000_000, repeat=7)) * 1e3
    return {"idle_check_ns": round(check, 1), "empty_call_ns": round(base, 1), "extra_ns": round(check - base, 1)}


def one_run(steps: int) -> list[dict]:
    """One 2-rank run; every rank's status of each of its three profiles."""
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "loop.py"
        script.write_text(PROGRAM)
        env = {**os.environ, "FSDPCTL_RUN_DIR": folder, "FSDPCTL_PROFILE_STEPS": "20-22",
               "FSDPCTL_PROFILE_RANKS": "all", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               str(script), str(steps)], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        found = []
        for status in sorted(Path(folder, "profile").glob("*/status/rank*.json")):
            data = json.loads(status.read_text())
            trace = status.parent.parent / f"rank{data['rank']}.json.gz"
            data["trace_bytes"] = trace.stat().st_size if trace.exists() else None
            data["trace_raw_bytes"] = len(gzip.decompress(trace.read_bytes())) if trace.exists() else None
            found.append(data)
        return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=110)
    args = parser.parse_args()
    idle = idle_ns()
    statuses = [s for _ in range(args.repeats) for s in one_run(args.steps)]
    done = [s for s in statuses if s["state"] == "done"]
    ratios, step_ms = [], []
    for status in done:
        times = [(t["end_ns"] - t["begin_ns"]) / 1e9 for t in status["step_times"]]
        ratios.append(statistics.fmean(times) / status["unprofiled_step_s"])
        step_ms.append(status["unprofiled_step_s"] * 1e3)
    step_s = statistics.median(step_ms) / 1e3
    def kb(key: str) -> float:
        return round(statistics.median(s[key] for s in done) / 1024, 1)

    result = {"machine": machine(), "idle": {**idle, "unprofiled_step_ms": round(step_s * 1e3, 3),
                                             "share_of_a_step_pct": round(100 * idle["extra_ns"] / 1e9 / step_s, 5)},
              "profiled": {"profiles": len(done), "not_done": [s["state"] for s in statuses if s["state"] != "done"],
                           "ratio_median": round(statistics.median(ratios), 3), "ratio_max": round(max(ratios), 3),
                           "trace_kb_gzipped_median": kb("trace_bytes"), "trace_kb_raw_median": kb("trace_raw_bytes")}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "profile_cost.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
