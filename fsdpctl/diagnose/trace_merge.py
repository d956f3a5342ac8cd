"""Every profiled rank's ``torch.profiler`` trace, merged into one Chrome trace that Perfetto and
``chrome://tracing`` open: one process per rank (named by rank and host), clocks aligned across nodes,
the profiled steps marked on every rank, and the same collective linked across ranks.

- **Clocks.** A trace's timestamps are microseconds after its ``baseTimeNanoseconds``, on its node's
  wall clock. Each node's clock minus the launcher's (``offset_ns``, measured by the launcher, NTP's
  way) is taken off where it is larger than the measurement's own error, so every rank stands on the
  launcher's clock; the offsets measured and taken off, and how far each may be off, are written in
  the merged trace's ``fsdpctl`` metadata.
- **Steps.** Each rank's status gives each profiled step's start and end on its clock: a slice
  ``step N`` on a track of its own per rank.
- **Collectives.** Where an event gives its process group and sequence number (NCCL's records:
  ``Process Group Name`` and ``Seq``), that pair names the collective; else the n-th call of the same
  collective in the profiled steps (every rank issues its collectives in the same order). The same
  collective on every rank is joined by one flow arrow.
- **Ids.** Processes are renumbered per rank (``rank * PIDS_PER_RANK + k``) and flow ids made unique,
  since every rank's own pids and ids are its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

PIDS_PER_RANK = 16
STEP_TID = 1 << 30
"""The steps' track in each rank's process (above any real thread id)."""
FLOW_IDS_PER_RANK = 1 << 40
LINK_CATEGORY = "fsdpctl_collective"
COMM_PREFIXES = ("c10d::", "nccl:", "gloo:", "record_param_comms")


@dataclass
class RankTrace:
    """One rank's trace as it came back, with what its status said and its node's clock."""

    rank: int
    host: str
    trace: dict[str, Any]
    status: dict[str, Any] = field(default_factory=dict)
    offset_ns: int = 0
    offset_error_ns: Optional[int] = None

    @property
    def base_ns(self) -> int:
        return int(self.trace.get("baseTimeNanoseconds") or 0)

    def to_launcher_us(self, ts: float) -> float:
        """An event's ``ts`` as microseconds since the epoch on the launcher's clock."""
        return (self.base_ns - self.offset_ns) / 1e3 + float(ts)

    def steps(self) -> list[tuple[int, float, float]]:
        """(step, start, end) in launcher microseconds since the epoch."""
        return [(int(s["step"]), (int(s["begin_ns"]) - self.offset_ns) / 1e3, (int(s["end_ns"]) - self.offset_ns) / 1e3)
                for s in self.status.get("step_times") or [] if s.get("begin_ns") and s.get("end_ns")]


def training_thread(events: Sequence[dict[str, Any]]) -> Any:
    """The thread that ran the most operators (the training loop's; autograd's CPU work runs there too)."""
    counts: dict[Any, int] = {}
    for event in events:
        if event.get("cat") == "cpu_op":
            counts[event.get("tid")] = counts.get(event.get("tid"), 0) + 1
    return max(counts, key=counts.__getitem__) if counts else None


def is_comm(event: Mapping[str, Any]) -> bool:
    """A collective's event: c10d's calls, the backends' own ranges, NCCL's kernels and comm records."""
    name = str(event.get("name", ""))
    args = event.get("args") or {}
    return (name.startswith(COMM_PREFIXES) or "Collective name" in args
            or (event.get("cat") == "kernel" and "nccl" in name.lower()))


def collective_key(event: Mapping[str, Any], seen: dict[str, int]) -> Optional[tuple]:
    """What names this collective across ranks (None: not a collective call to link)."""
    args = event.get("args") or {}
    if "Seq" in args and "Process Group Name" in args:
        return ("seq", str(args["Process Group Name"]), args["Seq"])
    name = str(event.get("name", ""))
    if event.get("ph") != "X" or not (name.startswith("c10d::") or (event.get("cat") == "kernel"
                                                                     and "nccl" in name.lower())):
        return None
    seen[name] = seen.get(name, 0) + 1
    return ("order", name, seen[name])


def _collectives(trace: RankTrace) -> dict[tuple, dict[str, Any]]:
    """This rank's collective calls by key (the first event of each), in time order."""
    seen: dict[str, int] = {}
    found: dict[tuple, dict[str, Any]] = {}
    events = sorted((e for e in trace.trace.get("traceEvents") or [] if e.get("ph") == "X"),
                    key=lambda e: float(e.get("ts", 0)))
    for event in events:
        key = collective_key(event, seen)
        if key is not None and key not in found:
            found[key] = event
    return found


def merge(traces: Sequence[RankTrace], meta: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """One Chrome trace of ``traces`` (see the module's text); ``meta`` goes into its ``fsdpctl`` metadata."""
    ordered = sorted(traces, key=lambda t: t.rank)
    starts = [t.to_launcher_us(e["ts"]) for t in ordered for e in t.trace.get("traceEvents") or [] if "ts" in e]
    starts += [s[1] for t in ordered for s in t.steps()]
    zero = min(starts) if starts else 0.0
    events: list[dict[str, Any]] = []
    pid_maps: dict[int, dict[Any, int]] = {}
    for trace in ordered:
        pid_maps[trace.rank] = _rank_events(trace, zero, events)
    events += _links(ordered, zero, pid_maps)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "fsdpctl": {**(meta or {}), "zero_ns": int(zero * 1e3),
                        "ranks": [{"rank": t.rank, "host": t.host, "clock_offset_ns": t.offset_ns,
                                   "clock_error_ns": t.offset_error_ns, "steps": [s[0] for s in t.steps()],
                                   "cut": t.status.get("cut")} for t in ordered]}}


def _rank_events(trace: RankTrace, zero: float, out: list[dict[str, Any]]) -> dict[Any, int]:
    """This rank's events into ``out``, renumbered and on the common clock; its map of pids."""
    pids: dict[Any, int] = {}
    names: dict[Any, str] = {}
    source = trace.trace.get("traceEvents") or []
    for event in source:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            names[event.get("pid")] = str((event.get("args") or {}).get("name", ""))
    for event in source:
        pid = event.get("pid")
        if pid not in pids:
            pids[pid] = trace.rank * PIDS_PER_RANK + min(len(pids), PIDS_PER_RANK - 1)
    cpu_pid = trace.rank * PIDS_PER_RANK
    label = f"rank {trace.rank} ({trace.host})"
    for pid, new in pids.items():
        own = names.get(pid, "")
        shown = label if new == cpu_pid else f"{label} {own or pid}"
        out.append({"ph": "M", "name": "process_name", "pid": new, "tid": 0, "args": {"name": shown}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": new, "tid": 0, "args": {"sort_index": new}})
    for event in source:
        if event.get("ph") == "M" and event.get("name") in ("process_name", "process_sort_index", "process_labels"):
            continue
        copy = dict(event)
        copy["pid"] = pids.get(event.get("pid"), cpu_pid)
        if "ts" in copy:
            copy["ts"] = round(trace.to_launcher_us(copy["ts"]) - zero, 3)
        if "id" in copy and copy.get("ph") in ("s", "t", "f"):
            copy["id"] = _flow_id(trace.rank, copy["id"])
        out.append(copy)
    out.append({"ph": "M", "name": "thread_name", "pid": cpu_pid, "tid": STEP_TID, "args": {"name": "fsdpctl steps"}})
    out.append({"ph": "M", "name": "thread_sort_index", "pid": cpu_pid, "tid": STEP_TID, "args": {"sort_index": -1}})
    for step, start, end in trace.steps():
        out.append({"ph": "X", "cat": "fsdpctl_step", "name": f"step {step}", "pid": cpu_pid, "tid": STEP_TID,
                    "ts": round(start - zero, 3), "dur": round(end - start, 3), "args": {"step": step}})
    return pids


def _flow_id(rank: int, ident: Any) -> Any:
    try:
        return rank * FLOW_IDS_PER_RANK + int(ident)
    except (TypeError, ValueError):
        return f"{rank}:{ident}"


def _links(traces: Iterable[RankTrace], zero: float, pid_maps: Mapping[int, Mapping[Any, int]]) -> list[dict]:
    """A flow arrow through the same collective on every rank that ran it, in rank order."""
    by_key: dict[tuple, list[tuple[RankTrace, dict[str, Any]]]] = {}
    for trace in traces:
        for key, event in _collectives(trace).items():
            by_key.setdefault(key, []).append((trace, event))
    flows: list[dict[str, Any]] = []
    for number, (key, calls) in enumerate(sorted(by_key.items(), key=lambda item: str(item[0])), start=1):
        if len(calls) < 2:
            continue
        for index, (trace, event) in enumerate(calls):
            phase = "s" if index == 0 else "f" if index == len(calls) - 1 else "t"
            flow = {"ph": phase, "cat": LINK_CATEGORY, "name": f"{key[1]} #{key[2]}", "id": number,
                    "pid": pid_maps[trace.rank].get(event.get("pid"), trace.rank * PIDS_PER_RANK),
                    "tid": event.get("tid"), "ts": round(trace.to_launcher_us(event["ts"]) - zero, 3)}
            if phase != "s":
                flow["bp"] = "e"
            flows.append(flow)
    return flows


def linked_collectives(merged: Mapping[str, Any]) -> int:
    """How many collectives the merged trace links across ranks."""
    return len({e["id"] for e in merged.get("traceEvents") or [] if e.get("cat") == LINK_CATEGORY})


def with_step_marks(trace: RankTrace) -> dict[str, Any]:
    """The rank's own trace with a ``ProfilerStep#N`` range per profiled step on its training thread, as
    torch.profiler's schedule marks steps (HTA splits its analyses by them)."""
    events = list(trace.trace.get("traceEvents") or [])
    timed = [e for e in events if e.get("ph") == "X"]
    thread = training_thread(timed)
    pid = next((e.get("pid") for e in timed if e.get("tid") == thread), 0)
    base_us = trace.base_ns / 1e3
    for s in trace.status.get("step_times") or []:
        begin, end = int(s["begin_ns"]) / 1e3 - base_us, int(s["end_ns"]) / 1e3 - base_us
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s['step']}", "pid": pid,
                       "tid": thread, "ts": round(begin, 3), "dur": round(end - begin, 3), "args": {}})
    return {**trace.trace, "traceEvents": events}
