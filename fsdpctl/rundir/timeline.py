"""Where a launch's seconds go: every phase of an attempt, per node where nodes differ.

The launching process times its own phases (its start, the plan, each node's connection, staging,
probe, the parity judgement, the agents' start); whoever collects the run (the launcher, a detached
run's follower, Slurm's follow loop) adds the moments the nodes' lines show (torchrun started, the
rendezvous done, the first line, the first step, the last line, the logs complete, the exit). They
meet in run.json's ``timeline``: ``origin`` (seconds since the epoch) and per phase each node's
``[begin, end]`` in seconds after it; a phase is done when its slowest node is.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Optional

from .lines import STEP_LINE, ranks_said

PHASES: dict[str, str] = {
    "startup": "fsdpctl started",
    "plan": "profile and plan",
    "submit": "submitted to the scheduler",
    "queued": "waited in the queue",
    "connect": "connected",
    "dropped": "dropped by its sshd or its handshake timed out, tried again",
    "reopened": "its session slow to open, opened again",
    "stage": "payload staged",
    "probe": "preflight probe answered",
    "parity": "parity judged",
    "agents": "agents started",
    "torchrun": "torchrun started",
    "rendezvous": "rendezvous done (ranks started)",
    "first_line": "first line",
    "first_step": "first step",
    "last_line": "last line",
    "exit": "exited",
    "logs": "logs complete",
}
"""Every phase, in the order a launch goes through them, with what its end means."""
LAUNCHER = "launcher"
"""The node key of a phase the launching process goes through once for all nodes."""
NODE_HEADER = "fsdpctl: node "
"""The node script's line just before it starts torchrun (templates/torchrun.sh.j2)."""


def process_started() -> Optional[float]:
    """When this process started (seconds since the epoch, to a clock tick), from /proc; None where
    there is none. (Its start is kept in ticks since boot: the boot clock, read now, places it.)"""
    try:
        with open("/proc/self/stat") as handle:
            ticks = int(handle.read().rpartition(")")[2].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))


class Timeline:
    """The phases of one attempt: thread-safe, since nodes are connected, staged and started at once."""

    def __init__(self, origin: Optional[float] = None, spans: Optional[Mapping[str, Mapping[str, list]]] = None):
        self.origin = origin if origin is not None else time.time()
        self.spans: dict[str, dict[str, list[float]]] = {p: dict(n) for p, n in (spans or {}).items()}
        self.lock = threading.Lock()
        self.changed = False

    # ---- recording -------------------------------------------------------------------------------
    def begin(self, phase: str, node: Any = LAUNCHER, at: Optional[float] = None) -> None:
        """``node`` (a node rank, or the launcher) begins ``phase`` (now, or at ``at``)."""
        self._widen(phase, node, at, 0, min)

    def end(self, phase: str, node: Any = LAUNCHER, at: Optional[float] = None) -> None:
        """``node`` is done with ``phase``."""
        self._widen(phase, node, at, 1, max)

    def _widen(self, phase: str, node: Any, at: Optional[float], side: int, pick) -> None:
        moment = (time.time() if at is None else at) - self.origin
        with self.lock:
            span = self.spans.setdefault(phase, {}).setdefault(str(node), [moment, moment])
            span[side] = pick(span[side], moment)
            self.changed = True

    def reached(self, phase: str, node: Any = LAUNCHER, at: Optional[float] = None, last: bool = False) -> None:
        """A moment: ``node`` reached ``phase`` (the first time, or with ``last`` the latest time)."""
        at = time.time() if at is None else at
        with self.lock:
            nodes = self.spans.setdefault(phase, {})
            key = str(node)
            if key in nodes and not last:
                return
            moment = at - self.origin
            nodes[key] = [moment, moment]
            self.changed = True

    @contextmanager
    def span(self, phase: str, node: Any = LAUNCHER) -> Iterator[None]:
        """``with timeline.span("connect", 3):`` the node's part of a phase, however it ends."""
        self.begin(phase, node)
        try:
            yield
        finally:
            self.end(phase, node)

    # ---- reading ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        with self.lock:
            return {"origin": round(self.origin, 3),
                    "phases": {p: {n: [round(a, 3), round(b, 3)] for n, (a, b) in sorted(nodes.items())}
                               for p, nodes in sorted(self.spans.items(), key=lambda item: _order(item[0]))}}

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> Optional[Timeline]:
        if not isinstance(data, Mapping) or not isinstance(data.get("origin"), (int, float)):
            return None
        phases = data.get("phases") if isinstance(data.get("phases"), Mapping) else {}
        spans = {str(p): {str(n): [float(s[0]), float(s[1])] for n, s in nodes.items()
                          if isinstance(s, (list, tuple)) and len(s) == 2}
                 for p, nodes in phases.items() if isinstance(nodes, Mapping)}
        return cls(float(data["origin"]), spans)

    def merged(self, other: Optional[Timeline]) -> Timeline:
        """This timeline with ``other``'s spans added (the earliest begin, the latest end of each)."""
        if other is None:
            return self
        out = Timeline(min(self.origin, other.origin))
        for source in (self, other):
            shift = source.origin - out.origin
            for phase, nodes in source.spans.items():
                for node, (a, b) in nodes.items():
                    span = out.spans.setdefault(phase, {}).setdefault(node, [a + shift, b + shift])
                    span[0], span[1] = min(span[0], a + shift), max(span[1], b + shift)
        return out


def _order(phase: str) -> int:
    return list(PHASES).index(phase) if phase in PHASES else len(PHASES)


class LineMoments:
    """The moments a node's lines show, marked on ``timeline`` as the lines arrive: its script's
    header (torchrun starts next), its ranks' first words (the rendezvous is done), the program's
    first line, its first step, its last line."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self.seen: dict[int, set[str]] = {}

    def saw(self, node_rank: int, lines: Iterable[Any], at: Optional[float] = None) -> None:
        """A batch of one node's LogLines, arrived ``at`` (now)."""
        at = time.time() if at is None else at
        seen = self.seen.setdefault(node_rank, set())

        def mark(phase: str) -> None:
            if phase not in seen:
                seen.add(phase)
                self.timeline.reached(phase, node_rank, at)

        any_line = False
        for line in lines:
            any_line = True
            if line.rank is None:
                if line.text.startswith(NODE_HEADER):
                    mark("torchrun")
                continue
            mark("rendezvous")  # a rank's first words: its own naming of its ranks, or the program's
            if ranks_said(line) is not None:
                continue
            mark("first_line")
            if "step=" in line.text and STEP_LINE.search(line.text):
                mark("first_step")
        if any_line and "first_line" in seen:
            self.timeline.reached("last_line", node_rank, at, last=True)


# ---- the attempts this process times ------------------------------------------------------------
_TIMELINES: dict[tuple[str, int], Timeline] = {}
_LOCK = threading.Lock()
_PROCESS_START: list[float] = []


def note_process_start() -> None:
    """For a command-line process: its first launch's timeline begins when the process began (the
    imports and the profile's reading are the user's seconds too)."""
    started = process_started()
    if started is not None:
        _PROCESS_START[:] = [started]


def take_process_start() -> Optional[float]:
    """The process's start, once (a second launch in the same process begins at its own call)."""
    with _LOCK:
        return _PROCESS_START.pop() if _PROCESS_START else None


def timeline_for(run_id: str, attempt: int, origin: Optional[float] = None) -> Timeline:
    """This process's timeline of an attempt (made on first use; ``origin``: when it began)."""
    with _LOCK:
        found = _TIMELINES.get((run_id, attempt))
        if found is None:
            found = _TIMELINES[(run_id, attempt)] = Timeline(origin)
        return found


def forget(run_id: str, attempt: int) -> Optional[Timeline]:
    """This process's timeline of an attempt, taken out of the registry (once it is recorded)."""
    with _LOCK:
        return _TIMELINES.pop((run_id, attempt), None)


# ---- how it is shown ----------------------------------------------------------------------------
def rows(data: Optional[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """run.json's timeline as rows, in phase order: the phase, when its first node began and its
    slowest node was done (seconds after the launch began), what it added to the launch, and the
    slowest and fastest nodes where nodes differ."""
    timeline = Timeline.from_json(data)
    if timeline is None:
        return []
    out, previous_end = [], 0.0
    for phase, nodes in sorted(timeline.spans.items(), key=lambda item: _order(item[0])):
        if not nodes:
            continue
        begin = min(span[0] for span in nodes.values())
        done = max(span[1] for span in nodes.values())
        ranked = sorted(((span[1], node) for node, span in nodes.items() if node != LAUNCHER))
        row = {"phase": phase, "what": PHASES.get(phase, phase), "begin": round(begin, 3), "done": round(done, 3),
               "added": round(max(0.0, done - previous_end), 3), "nodes": len(ranked)}
        if len(ranked) > 1:
            row.update(fastest_node=ranked[0][1], fastest_done=round(ranked[0][0], 3),
                       slowest_node=ranked[-1][1], slowest_done=round(ranked[-1][0], 3))
        out.append(row)
        previous_end = max(previous_end, done)
    return out


def render(found: list[dict[str, Any]], host_of: Mapping[str, str] | None = None) -> list[str]:
    """A timeline's ``rows`` as text lines (``status --timings``, ``report``)."""
    if not found:
        return ["no timeline recorded (a run started before fsdpctl timed its launches, or not started yet)"]
    host_of = host_of or {}
    width = max(len(row["what"]) for row in found)
    lines = [f"{'phase':<{width}}  {'done at':>8}  {'added':>7}  nodes (fastest .. slowest done at)"]
    for row in found:
        spread = ""
        if "slowest_node" in row:
            slowest, fastest = row["slowest_node"], row["fastest_node"]
            spread = (f"node {fastest} ({host_of.get(fastest, '?')}) {row['fastest_done']:.2f} s .. "
                      f"node {slowest} ({host_of.get(slowest, '?')}) {row['slowest_done']:.2f} s")
        elif row["nodes"] == 1:
            spread = "1 node"
        lines.append(f"{row['what']:<{width}}  {row['done']:>7.2f}s  {row['added']:>6.2f}s  {spread}".rstrip())
    return lines
