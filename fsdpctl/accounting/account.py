"""Every second of a run in exactly one category: the partition behind the goodput account.

The facts (``RunFacts``: each attempt's span, its windows of steps, its checkpoint calls, its failure)
come from ``fsdpctl.accounting.facts``; this module only divides time. Each fact becomes an interval on
one clock (seconds since the epoch) with a category and a precedence; where intervals overlap the
higher one wins, so no second is counted twice by construction, and what no interval covers is
``unattributed``. A window of steps keeps what no higher interval took, and that is split into its
warm-up excess, data wait, collective wait and productive time by the ranks' own figures.

Conventions (``docs/guides/goodput.md`` says them for users):
- work done again is booked on the attempt that was thrown away (Google's convention): the steps of a
  failed attempt after its last complete checkpoint, and its partial step up to the failure;
- a checkpoint costs what it blocked the ranks (an async save: its call and the program's waits on its
  future, not the write behind it);
- an attempt's warm-up is its first window's excess over the median step of the attempt;
- GPU-seconds are ranks x seconds (on a CPU, ranks stand for GPUs); the ranks a run holds but does not
  run (spares, a shrunk attempt's missing nodes, a node whose ranks left before the others) are idle.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from .minutes import Minutes, step_shares

CATEGORIES: dict[str, str] = {
    "productive": "productive steps",
    "data_wait": "data wait in steps",
    "collective_wait": "collective wait in steps",
    "warmup": "warm-up, compile",
    "startup": "start-up to first step",
    "checkpoint_load": "checkpoint load",
    "checkpoint_save": "checkpoint save",
    "between_steps": "eval, other between steps",
    "redone": "work done again",
    "hang": "hang",
    "stood_still": "stood still, restarting",
    "shutdown": "last step to program exit",
    "release": "exit to release, logs",
    "idle": "held, idle",
    "unattributed": "unattributed",
}
"""Every category, in the order shown, and its label. What each holds: start-up is preflight, code copy,
environment and rendezvous up to an attempt's first step; warm-up is the first window's excess over the
attempt's median step; checkpoint save is what a save blocked the ranks; work done again is a failed
attempt's steps after its last complete checkpoint, its partial step with them; hang runs from the last
progress to the watchdog's verdict; stood still from a failure to the next attempt's start; then the
last step to the program's exit, where the start-up hook says it (else to the release), and the
processes' exit and the logs; held, idle
(GPU-hours only) are spares, a shrunk attempt's missing nodes and ranks that left before the others."""
IN_STEPS = ("productive", "data_wait", "collective_wait", "warmup")
"""The categories of time inside steps that survived: ETTR's numerator."""

# Precedence where intervals overlap (higher wins).
_PRECEDENCE = {"hang": 9, "checkpoint_load": 8, "checkpoint_save": 7, "redone": 6, "eval": 5, "step": 4,
               "between_steps": 3, "startup": 2, "shutdown": 2, "release": 2, "stood_still": 1}


@dataclass
class Window:
    """One window of steps, every rank's: where it ends, how many steps, and per step (the mean over
    the ranks) what its ranks waited for data and collectives; ``begin`` where known exactly (the
    start-up hook's steps tile), else the window starts where the one before it ended."""

    end: float
    steps: int
    last_step: int
    data_s: float = 0.0
    comm_s: float = 0.0
    begin: Optional[float] = None
    straggler_s: float = 0.0
    """Per step: the slowest rank's compute over the median rank's (what the others waited for it)."""
    estimated_begin: Optional[float] = None
    """Where an attempt's first window began when nothing says so exactly: its end less its steps at
    the pace it or the windows after it ran (a program's own rows)."""


@dataclass
class Timed:
    """A checkpoint call or an evaluation: when it began and how long it took."""

    began: float
    seconds: float
    kind: str
    """``save``, ``load``, ``eval``, or ``written``: an async save's write behind the steps, from its
    call's start (it blocked nobody: no interval of its own)."""
    step: Optional[int] = None
    """The bundled workload's step; for a program's save, the steps its hook had counted."""
    is_async: bool = False
    complete: bool = False
    """A save that left a complete checkpoint (not an async call, not ``get_state_dict``)."""
    wait: bool = False
    """The program waiting on an async save's future (inside checkpoint save, shown apart)."""

    @property
    def end(self) -> float:
        return self.began + self.seconds


@dataclass
class AttemptFacts:
    """One attempt as the account needs it."""

    number: int
    begin: float
    end: float
    ranks: int
    held: int
    """Ranks' worth of devices the run holds during it: its ranks and its spares' (a shrunk attempt:
    the full size's)."""
    windows: list[Window] = field(default_factory=list)
    timed: list[Timed] = field(default_factory=list)
    steps_begin: Optional[float] = None
    """When its first window began, where the program says (the bundled workload's loop start)."""
    failed: bool = False
    failed_at: Optional[float] = None
    """When the failure happened (a node's exit; None: its end)."""
    hang_at: Optional[float] = None
    """When the watchdog gave its verdict, where it ended the attempt."""
    durable_at: Optional[float] = None
    """The end of the last complete checkpoint the next attempt continues from (None: none in it)."""
    durable_step: Optional[int] = None
    program_exit: Optional[float] = None
    """When the program left (the start-up hook's exit handler, rank 0), where it says."""
    node_exits: list[tuple[float, int]] = field(default_factory=list)
    """(when, ranks) of each node's exit: a node that left early holds idle devices until the end."""

    def first_begin(self) -> Optional[float]:
        if not self.windows:
            return None
        first = self.windows[0]
        if first.begin is not None:
            return first.begin
        return self.steps_begin if self.steps_begin is not None else first.estimated_begin

    def last_end(self) -> Optional[float]:
        return self.windows[-1].end if self.windows else None


@dataclass
class RunFacts:
    begin: float
    end: float
    attempts: list[AttemptFacts]
    queued_s: float = 0.0


@dataclass
class Account:
    """A run's seconds and GPU-seconds by category, and what they add up to."""

    wall_s: float
    seconds: dict[str, float]
    gpu_s: dict[str, float]
    held_gpu_s: float
    steps_redone: int = 0
    straggler_s: float = 0.0
    """What-if: the time the other ranks waited for the slowest one (inside collective wait)."""
    async_save_s: float = 0.0
    """Async saves' calls (inside checkpoint save): the writes behind them are not counted."""
    async_wait_s: float = 0.0
    """The program's waits on async saves' futures (inside checkpoint save)."""
    async_written_s: float = 0.0
    """Async saves' writes behind the steps, after their calls returned: blocked nobody, not counted."""
    eval_s: float = 0.0
    queued_s: float = 0.0
    attempts: int = 1
    minutes: Optional[dict] = None
    """Where each minute went (``fsdpctl.accounting.minutes``): ``bucket_s``, and per bucket its seconds by
    category (one run's; None for several runs' together)."""

    @property
    def ettr(self) -> Optional[float]:
        """Time in steps that survived over wall time (Meta's and Google's ratio)."""
        return sum(self.seconds[c] for c in IN_STEPS) / self.wall_s if self.wall_s > 0 else None

    @property
    def goodput(self) -> Optional[float]:
        """Strict goodput: productive time over wall time."""
        return self.seconds["productive"] / self.wall_s if self.wall_s > 0 else None

    def to_json(self) -> dict:
        return {"wall_s": round(self.wall_s, 3), "ettr": _round(self.ettr), "goodput": _round(self.goodput),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
                "gpu_hours": {k: round(v / 3600, 6) for k, v in self.gpu_s.items()},
                "held_gpu_hours": round(self.held_gpu_s / 3600, 6), "steps_redone": self.steps_redone,
                "straggler_s": round(self.straggler_s, 3), "async_save_s": round(self.async_save_s, 3),
                "async_wait_s": round(self.async_wait_s, 3), "async_written_s": round(self.async_written_s, 3),
                "eval_s": round(self.eval_s, 3), "queued_s": round(self.queued_s, 3), "attempts": self.attempts,
                "minutes": self.minutes}


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 5)


@dataclass
class _Interval:
    begin: float
    end: float
    label: str
    window: Optional[int] = None


def _intervals(attempt: AttemptFacts, following: Optional[AttemptFacts]) -> list[_Interval]:
    """Every interval of one attempt, and of the stillness up to the next one."""
    out: list[_Interval] = []
    first, last = attempt.first_begin(), attempt.last_end()
    if first is None:  # no step: all of it start-up (or, once failed, a failure before any step)
        failed_at = attempt.failed_at if attempt.failed and attempt.failed_at is not None else attempt.end
        out.append(_Interval(attempt.begin, failed_at, "startup"))
        out.append(_Interval(failed_at, attempt.end, "stood_still"))
    else:
        out.append(_Interval(attempt.begin, first, "startup"))
        out.append(_Interval(first, last, "between_steps"))
        previous_end = first
        for index, window in enumerate(attempt.windows):
            begin = window.begin if window.begin is not None else previous_end
            out.append(_Interval(begin, window.end, "step", index))
            previous_end = window.end
        out.extend(_tail(attempt, last))
    for timed in attempt.timed:
        label = {"save": "checkpoint_save", "load": "checkpoint_load", "eval": "eval"}.get(timed.kind)
        if label is not None:
            out.append(_Interval(timed.began, timed.end, label))
    if attempt.failed and first is not None and last is not None:
        # Work thrown away: from the checkpoint the next attempt continues from (none: the first step)
        # to the failure, the partial step with it; a hang's own time is the hang's.
        durable = max(first, attempt.durable_at if attempt.durable_at is not None else first)
        until = last if attempt.hang_at is not None else max(last, attempt.failed_at or attempt.end)
        out.append(_Interval(durable, until, "redone"))
    if following is not None:
        out.append(_Interval(attempt.end, following.begin, "stood_still"))
    return out


def _tail(attempt: AttemptFacts, last: float) -> list[_Interval]:
    """From the last step to the attempt's end: the program's exit and the logs; for a failed
    attempt, its partial step up to the failure (redone, above), a hang, then the teardown."""
    if not attempt.failed:
        left = attempt.program_exit
        if left is None or not last <= left <= attempt.end:
            return [_Interval(last, attempt.end, "shutdown")]
        return [_Interval(last, left, "shutdown"), _Interval(left, attempt.end, "release")]
    if attempt.hang_at is not None:
        return [_Interval(last, attempt.hang_at, "hang"), _Interval(attempt.hang_at, attempt.end, "stood_still")]
    failed_at = attempt.failed_at if attempt.failed_at is not None else attempt.end
    return [_Interval(max(last, failed_at), attempt.end, "stood_still")]


def _sweep(intervals: list[_Interval], begin: float, end: float,
           segments: Optional[list[tuple[float, float, str, Optional[int]]]] = None
           ) -> tuple[dict[str, float], dict[int, float]]:
    """Seconds per label, each moment in [begin, end] given to the highest interval over it (none:
    unattributed); and each window's seconds left to it; into ``segments``, each stretch as (from, to,
    label, its window). One pass over the sorted ends: a day's run has tens of thousands of windows."""
    edges: list[tuple[float, int, int]] = []
    for number, interval in enumerate(intervals):
        left, right = max(begin, interval.begin), min(end, interval.end)
        if right > left:
            edges += [(left, 1, number), (right, -1, number)]
    edges.sort(key=lambda e: (e[0], e[1]))
    counts = dict.fromkeys(_PRECEDENCE, 0)
    windows_open: dict[int, int] = {}
    labels: dict[str, float] = {}
    windows: dict[int, float] = {}
    at = begin
    ranked = sorted(_PRECEDENCE, key=_PRECEDENCE.__getitem__, reverse=True)

    def credit(until: float) -> None:
        if until <= at:
            return
        top = next((label for label in ranked if counts[label] > 0), "unattributed")
        labels[top] = labels.get(top, 0.0) + until - at
        window = max(windows_open) if top == "step" and windows_open else None
        if window is not None:
            windows[window] = windows.get(window, 0.0) + until - at
        if segments is not None:
            segments.append((at, until, top, window))

    for x, change, number in edges:
        credit(x)
        at = max(at, x)
        interval = intervals[number]
        counts[interval.label] += change
        if interval.window is not None:
            windows_open[interval.window] = windows_open.get(interval.window, 0) + change
            if windows_open[interval.window] <= 0:
                del windows_open[interval.window]
    credit(end)
    return labels, windows


def _split_steps(attempt: AttemptFacts, kept: dict[int, float],
                 each: Optional[dict[int, dict[str, float]]] = None) -> dict[str, float]:
    """Each window's seconds that survived, into warm-up, data wait, collective wait and productive
    (and each window's own split into ``each``)."""
    out = dict.fromkeys(IN_STEPS, 0.0)
    per_step = [kept[i] / w.steps for i, w in enumerate(attempt.windows) if i in kept and w.steps > 0]
    median = statistics.median(per_step[1:]) if len(per_step) > 1 else None
    for index, window in enumerate(attempt.windows):
        left = kept.get(index, 0.0)
        if left <= 0:
            continue
        if index == 0 and median is not None:
            excess = min(left, max(0.0, left - median * window.steps))
            out["warmup"] += excess
            left -= excess
        data = min(left, window.data_s * window.steps)
        comm = min(left - data, window.comm_s * window.steps)
        out["data_wait"] += data
        out["collective_wait"] += comm
        out["productive"] += left - data - comm
        if each is not None:
            each[index] = {"warmup": kept.get(index, 0.0) - left, "data_wait": data, "collective_wait": comm,
                           "productive": left - data - comm}
    return out


def account(facts: RunFacts) -> Account:
    """The run's account: every second from ``facts.begin`` to ``facts.end`` in one category, and
    the GPU-seconds of each."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    gpu_s = dict.fromkeys(CATEGORIES, 0.0)
    held_total = straggler = async_s = wait_s = written_s = eval_s = 0.0
    redone_steps = 0
    attempts = facts.attempts
    minutes = Minutes(facts.begin, facts.end - facts.begin)
    for index, attempt in enumerate(attempts):
        following = attempts[index + 1] if index + 1 < len(attempts) else None
        begin = facts.begin if index == 0 else attempt.begin
        end = following.begin if following is not None else facts.end
        segments: list[tuple[float, float, str, Optional[int]]] = []
        labels, kept = _sweep(_intervals(attempt, following), begin, end, segments)
        mine = dict.fromkeys(CATEGORIES, 0.0)
        for label, value in labels.items():
            if label != "step":  # a window's time is split below
                mine["between_steps" if label == "eval" else label] += value
        each: dict[int, dict[str, float]] = {}
        mine.update(_split_steps(attempt, kept, each))
        for at, until, label, window in segments:
            shares = step_shares(each.get(window, {})) if label == "step" else None
            minutes.add(at, until, shares or {"between_steps" if label in ("eval", "step") else label: 1.0})
        for name in CATEGORIES:
            seconds[name] += mine.get(name, 0.0)
        span = end - begin
        held_total += attempt.held * span
        early = min(_left_early(attempt), mine["release"] * attempt.ranks)
        for name in CATEGORIES:
            gpu_s[name] += mine.get(name, 0.0) * attempt.ranks
        gpu_s["release"] -= early
        gpu_s["idle"] += early + (attempt.held - attempt.ranks) * span
        straggler += sum(w.straggler_s * w.steps for i, w in enumerate(attempt.windows) if kept.get(i, 0) > 0)
        async_s += sum(t.seconds for t in attempt.timed if t.kind == "save" and t.is_async and not t.wait)
        wait_s += sum(t.seconds for t in attempt.timed if t.wait)
        written_s += _written_behind(attempt.timed)
        eval_s += sum(t.seconds for t in attempt.timed if t.kind == "eval")
        if attempt.failed and attempt.windows:
            durable = attempt.durable_step or 0
            redone_steps += max(0, attempt.windows[-1].last_step - durable)
    return Account(wall_s=facts.end - facts.begin, seconds=seconds, gpu_s=gpu_s, held_gpu_s=held_total,
                   steps_redone=redone_steps, straggler_s=straggler, async_save_s=async_s, async_wait_s=wait_s,
                   async_written_s=written_s, eval_s=eval_s, minutes=minutes.to_json(),
                   queued_s=facts.queued_s, attempts=len(attempts))


def _written_behind(timed: list[Timed]) -> float:
    """Seconds async saves wrote behind the steps: each write from its call's start, less the call."""
    calls = {t.began: t.seconds for t in timed if t.kind == "save" and t.is_async and not t.wait}
    return sum(max(0.0, t.seconds - calls.get(t.began, 0.0)) for t in timed if t.kind == "written")


def _left_early(attempt: AttemptFacts) -> float:
    """Rank-seconds of the nodes whose ranks left before the last node's, after the last step (a
    succeeded attempt's: a failed one's nodes are torn down by the failure)."""
    last = attempt.last_end()
    if attempt.failed or last is None or len(attempt.node_exits) < 2:
        return 0.0
    final = max(at for at, _ in attempt.node_exits)
    return sum(ranks * (final - max(at, last)) for at, ranks in attempt.node_exits if max(at, last) < final)


def combine(accounts: list[Account]) -> Account:
    """Several runs' accounts as one (``report --goodput``): their seconds and GPU-seconds added."""
    return Account(wall_s=sum(a.wall_s for a in accounts),
                   seconds={k: sum(a.seconds[k] for a in accounts) for k in CATEGORIES},
                   gpu_s={k: sum(a.gpu_s[k] for a in accounts) for k in CATEGORIES},
                   held_gpu_s=sum(a.held_gpu_s for a in accounts), steps_redone=sum(a.steps_redone for a in accounts),
                   straggler_s=sum(a.straggler_s for a in accounts), async_save_s=sum(a.async_save_s for a in accounts),
                   async_wait_s=sum(a.async_wait_s for a in accounts),
                   async_written_s=sum(a.async_written_s for a in accounts),
                   eval_s=sum(a.eval_s for a in accounts), queued_s=sum(a.queued_s for a in accounts),
                   attempts=sum(a.attempts for a in accounts))
