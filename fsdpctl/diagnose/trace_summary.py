"""What the profiled steps of every rank spent their time on, from the ranks' traces: per rank its
compute, communication, their overlap and its idle time per step; the straggler's top operators
against the median rank's; and one line saying where the extra time goes.

- **On a GPU** (the trace has kernels): compute is the time some non-NCCL kernel runs, communication
  the time some NCCL kernel runs, overlap both at once, idle neither (HTA's temporal breakdown, by
  kernel intervals).
- **On a CPU** (no kernels): compute is the time the training thread runs an operator (``aten::mm``,
  ``fsdp::all_gather_copy_in``; not autograd's wrappers, inside which FSDP's hooks wait for
  collectives, nor c10d's calls); communication the time a collective is in flight on the
  backend's threads (gloo's ``gloo:*`` ranges) or called on the training thread; idle the rest of the
  step, where the training thread waits.
- **Operators** are ranked by self time per step (a kernel's own time on a GPU).
- **The straggler** is the rank whose compute per step is highest, where it is above ``SLOW_RATIO``
  of the median rank's (the middle rank by compute, the faster of the two middles for an even
  count); with none above it, the ranks are even.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from .trace_merge import RankTrace, is_comm, training_thread

SLOW_RATIO = 1.1
WRAPPERS = ("autograd::", "torch::autograd::", "c10d::", "record_param_comms", "ProfilerStep")
TOP_OPERATORS = 5
TIMELINE_DETAIL = 2000
"""A rank's timeline keeps gaps longer than its profiled window / this (a picture's pixel, about)."""

Interval = tuple[float, float]


def union(intervals: Sequence[Interval]) -> list[Interval]:
    """Overlapping intervals joined, in order."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersection(first: Sequence[Interval], second: Sequence[Interval]) -> list[Interval]:
    """Where two sorted, disjoint lists of intervals overlap."""
    out, i, j = [], 0, 0
    while i < len(first) and j < len(second):
        start, end = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        if start < end:
            out.append((start, end))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(intervals: Sequence[Interval], window: Interval) -> list[Interval]:
    return [(max(a, window[0]), min(b, window[1])) for a, b in intervals if b > window[0] and a < window[1]]


def _spans(trace: RankTrace, events: Sequence[dict[str, Any]]) -> list[Interval]:
    return [(trace.to_launcher_us(e["ts"]), trace.to_launcher_us(e["ts"]) + float(e.get("dur", 0))) for e in events]


def is_operator(event: Mapping[str, Any]) -> bool:
    """An operator that computes (``aten::mm``, ``fsdp::all_gather_copy_in``), not a wrapper around others:
    autograd's nodes and engine calls, and the Python hooks inside them, wait for collectives there."""
    name = str(event.get("name", ""))
    return "::" in name and not name.startswith(WRAPPERS) and not is_comm(event)


def self_times(events: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each operator's self time in microseconds (its time less that of the operators it called)."""
    totals: dict[str, float] = {}
    stack: list[list[Any]] = []  # [end, name, its callees' time, its own duration]
    for event in sorted(events, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)))):
        start, dur = float(event["ts"]), float(event.get("dur", 0))
        while stack and stack[-1][0] <= start:
            end, name, inner, own = stack.pop()
            totals[name] = totals.get(name, 0.0) + own - inner
        if stack:
            stack[-1][2] += dur
        stack.append([start + dur, str(event.get("name")), 0.0, dur])
    for _end, name, inner, own in stack:
        totals[name] = totals.get(name, 0.0) + own - inner
    return totals


def breakdown(trace: RankTrace) -> Optional[dict[str, Any]]:
    """One rank's figures per step over its profiled steps (None: no step was recorded)."""
    steps = trace.steps()
    if not steps:
        return None
    window = (min(s[1] for s in steps), max(s[2] for s in steps))
    timed = [e for e in trace.trace.get("traceEvents") or [] if e.get("ph") == "X" and "ts" in e]
    kernels = [e for e in timed if e.get("cat") == "kernel"]
    if kernels:
        device = "gpu"
        comm_events = [e for e in kernels if is_comm(e)]
        compute_events = [e for e in kernels if not is_comm(e)]
        operators: dict[str, float] = {}
        for kernel in kernels:  # streams run at once: a kernel's own time is its whole time
            name = str(kernel.get("name"))
            operators[name] = operators.get(name, 0.0) + float(kernel.get("dur", 0))
    else:
        device = "cpu"
        thread = training_thread(timed)
        mine = [e for e in timed if e.get("tid") == thread and e.get("cat") == "cpu_op"]
        compute_events = [e for e in mine if is_operator(e)]
        comm_events = [e for e in timed if is_comm(e) and (e.get("tid") != thread or e.get("cat") == "cpu_op")]
        operators = {name: us for name, us in self_times(mine).items() if is_operator({"name": name})}
    compute = clip(union(_spans(trace, compute_events)), window)
    comm = clip(union(_spans(trace, comm_events)), window)
    count = len(steps)
    wall = window[1] - window[0]
    timeline = {"compute": coarse(compute, wall / TIMELINE_DETAIL), "comm": coarse(comm, wall / TIMELINE_DETAIL),
                "steps": [[s[0], s[1], s[2]] for s in steps]}
    overlap = length(intersection(compute, comm))
    busy = length(union(compute + comm))
    per_step = 1e3 * count  # microseconds over the steps, into milliseconds per step
    return {"rank": trace.rank, "host": trace.host, "device": device, "steps": [s[0] for s in steps],
            "step_ms": round(wall / per_step, 3), "compute_ms": round(length(compute) / per_step, 3),
            "comm_ms": round(length(comm) / per_step, 3), "overlap_ms": round(overlap / per_step, 3),
            "idle_ms": round(max(0.0, wall - busy) / per_step, 3),
            "operators_ms": {name: round(us / per_step, 4) for name, us in
                             sorted(operators.items(), key=lambda item: -item[1])[:40]},
            "timeline": timeline}


def coarse(intervals: Sequence[Interval], gap: float) -> list[list[float]]:
    """Intervals with gaps shorter than ``gap`` closed: what a picture of the window can show."""
    out: list[list[float]] = []
    for start, end in intervals:
        if out and start - out[-1][1] < gap:
            out[-1][1] = end
        else:
            out.append([start, end])
    return out


def _relative(ranks: list[dict[str, Any]]) -> None:
    """Every rank's timeline in milliseconds after the earliest profiled step's start (clocks aligned)."""
    zero = min(step[1] for r in ranks for step in r["timeline"]["steps"])
    for rank in ranks:
        line = rank["timeline"]
        for lane in ("compute", "comm"):
            line[lane] = [[round((a - zero) / 1e3, 3), round((b - zero) / 1e3, 3)] for a, b in line[lane]]
        line["steps"] = [[n, round((a - zero) / 1e3, 3), round((b - zero) / 1e3, 3)] for n, a, b in line["steps"]]


def _ms(value: float) -> str:
    return f"{value:.1f} ms" if value >= 1 else f"{value * 1e3:.0f} us"


def summarize(traces: Sequence[RankTrace]) -> dict[str, Any]:
    """Every rank's breakdown, the straggler and median ranks, the operators apart, and the verdict line."""
    ranks = [b for b in (breakdown(t) for t in sorted(traces, key=lambda t: t.rank)) if b is not None]
    summary: dict[str, Any] = {"ranks": ranks, "straggler": None, "median_rank": None, "operators": [],
                               "verdict": "no rank recorded a whole step"}
    if not ranks:
        return summary
    _relative(ranks)
    lines = [f"rank {r['rank']} ({r['host']}): compute {_ms(r['compute_ms'])}, communication {_ms(r['comm_ms'])} "
             f"(overlapping compute {_ms(r['overlap_ms'])}), idle {_ms(r['idle_ms'])} per step of "
             f"{_ms(r['step_ms'])}, steps {r['steps'][0]}-{r['steps'][-1]}" for r in ranks]
    summary["lines"] = lines
    if len(ranks) < 2:
        summary["verdict"] = f"1 rank profiled (rank {ranks[0]['rank']}): nothing to compare it with"
        return summary
    # the lower of two middles: with 2 ranks the faster is the yardstick, which a float tie must not flip
    by_compute = sorted(ranks, key=lambda r: (r["compute_ms"], r["rank"]))
    median = by_compute[(len(by_compute) - 1) // 2]
    slowest = max(ranks, key=lambda r: r["compute_ms"])
    summary["median_rank"] = median["rank"]
    if slowest is median or slowest["compute_ms"] <= SLOW_RATIO * max(median["compute_ms"], 1e-9):
        summary["verdict"] = (f"ranks even: every rank's compute within {SLOW_RATIO:g}x of the median rank's "
                              f"({_ms(median['compute_ms'])} per step)")
        return summary
    extra = slowest["compute_ms"] - median["compute_ms"]
    apart = sorted(((name, ms - median["operators_ms"].get(name, 0.0), ms, median["operators_ms"].get(name, 0.0))
                    for name, ms in slowest["operators_ms"].items()), key=lambda item: -item[1])
    summary["straggler"] = slowest["rank"]
    summary["operators"] = [{"name": n, "extra_ms": round(d, 4), "straggler_ms": s, "median_ms": m}
                            for n, d, s, m in apart[:TOP_OPERATORS] if d > 0]
    top = ", ".join(f"{o['name']} (+{_ms(o['extra_ms'])})" for o in summary["operators"][:3])
    waits = median["comm_ms"] + median["idle_ms"] - slowest["comm_ms"] - slowest["idle_ms"]
    summary["verdict"] = (f"rank {slowest['rank']} ({slowest['host']}) is the straggler: its compute takes "
                          f"{slowest['compute_ms'] / max(median['compute_ms'], 1e-9):.2f}x the median rank's "
                          f"({_ms(slowest['compute_ms'])} per step against {_ms(median['compute_ms'])} on rank "
                          f"{median['rank']}); the extra {_ms(extra)} goes to {top or 'no operator of its own'}"
                          + (f"; rank {median['rank']} waits {_ms(waits)} more per step in communication and idle"
                             if waits > 0 else ""))
    return summary


PROFILES = "profiles"
"""Under a run's directory here: one folder per profile of it."""


def kept_profiles(run_path: Path) -> list[dict[str, Any]]:
    """The summaries of a run's profiles, oldest first (``report`` shows them)."""
    found = []
    for path in sorted((Path(run_path) / PROFILES).glob("*/summary.json")):
        try:
            found.append({**json.loads(path.read_text()), "trace": str(path.parent / "trace.json.gz")})
        except (OSError, ValueError):
            continue
    return found
