"""Where a workload step's time goes on a GPU: host vs device time per step, from torch.profiler.

Runs the bundled workload's own entry point in this process (one rank, no torchrun) with a
profiler that advances at every training step, then reads the profiled steps:
- wall ms per step (the pace of the loop);
- device busy ms per step (the union of kernel, copy and memset intervals on the device) and the
  share of the step the device sat idle: idle time means the host could not feed it;
- kernels, copies and memsets launched per step, and host time blocked in synchronisations;
- the host's costliest operators (self CPU time per step).

Run: python bench/gpu_profile.py [--wait 8] [--active 5] [--json OUT] -- WORKLOAD FLAGS...
(the workload flags as for ``python -m fsdpctl.workload.train``; which workload is profiled is
the one first on ``sys.path``, so PYTHONPATH=old-tree profiles an older version).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

# After PYTHONPATH: a tree given there (an older workload) is the one profiled.
sys.path.append(str(Path(__file__).resolve().parents[1]))

# Host calls that wait for the device (a drained stream, a full launch queue): host time not spent
# issuing work.
BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "Command Buffer Full")
EDGE = "fsdpctl.profile.edge"


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def is_device_work(event) -> bool:
    """A kernel, copy or memset on the device; not the profiler's own ranges shown on the device's
    track (``ProfilerStep*``, ``Optimizer.step#...``), which span whole steps."""
    from torch.autograd import DeviceType

    if getattr(event, "device_type", None) != DeviceType.CUDA or getattr(event, "is_user_annotation", False):
        return False
    return not (event.name.startswith("ProfilerStep") or "#" in event.name)


def analyse(events, active: int) -> dict:
    edges = sorted(e.time_range.start for e in events if e.name == EDGE)
    window = (edges[0], edges[-1])  # both drained: the device's own pace over the profiled steps
    wall = window[1] - window[0]
    inside = [e for e in events if window[0] <= e.time_range.start <= window[1]]
    device = [e for e in inside if is_device_work(e)]
    busy = union_us([(e.time_range.start, min(e.time_range.end, window[1])) for e in device])
    kinds = Counter("memcpy" if "emcpy" in e.name else "memset" if "emset" in e.name else "kernel"
                    for e in device)
    host = [e for e in inside if not is_device_work(e) and getattr(e, "device_type", None) is not None
            and e.name != EDGE and not e.name.startswith("ProfilerStep")]
    blocked = sum(e.cpu_time_total for e in host if e.name.startswith(BLOCKING))
    self_cpu: Counter = Counter()
    for e in host:
        if not is_device_work(e) and "#" not in e.name:
            self_cpu[e.name] += e.self_cpu_time_total
    device_time: Counter = Counter()
    for e in device:
        device_time[e.name[:80]] += e.time_range.end - e.time_range.start
    per_step = 1e3 * active
    return {
        "steps": active, "wall_ms_per_step": wall / per_step,
        "device_busy_ms_per_step": busy / per_step,
        "device_idle_share": 1 - busy / wall if wall else None,
        "host_waiting_on_device_ms_per_step": blocked / per_step,
        "host_issuing_ms_per_step": (wall - blocked) / per_step,
        "launches_per_step": {k: v / active for k, v in kinds.items()},
        "top_host_ops_ms_per_step": [(name, round(us / per_step, 3)) for name, us in self_cpu.most_common(15)],
        "top_device_ops_ms_per_step": [(name, round(us / per_step, 3)) for name, us in device_time.most_common(15)],
    }


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wait", type=int, default=8, help="steps before profiling (compilation, warm-up)")
    parser.add_argument("--active", type=int, default=5, help="steps profiled")
    parser.add_argument("--label", default="workload")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv[:split])
    workload_argv = argv[split + 1:]

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from fsdpctl.workload import metrics, train

    profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                       schedule=schedule(wait=args.wait, warmup=2, active=args.active, repeat=1))
    step_done = metrics.Meter.step_done
    calls = [0]
    # The device is drained where the profiled steps begin and where they end, so that their span is
    # the device's pace (the host otherwise runs steps ahead and a window would time the host).
    edges = (args.wait + 2, args.wait + 2 + args.active)

    def mark() -> None:
        with torch.profiler.record_function(EDGE):
            pass

    def step_and_advance(meter) -> None:
        step_done(meter)
        calls[0] += 1
        if calls[0] in edges and torch.cuda.is_available():
            torch.cuda.synchronize()
        if calls[0] == edges[1]:  # the last profiled step ends here
            mark()
        profiler.step()
        if calls[0] == edges[0]:  # the first profiled step starts here (events before are not kept)
            mark()

    metrics.Meter.step_done = step_and_advance
    profiler.start()
    try:
        train.main(workload_argv)
    except SystemExit as ended:  # a workload that stops on purpose still leaves its profiled steps
        if ended.code:
            raise
    finally:
        profiler.stop()
    result = {"label": args.label, **analyse(profiler.events(), args.active)}
    print("fsdpctl.profile: " + json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
