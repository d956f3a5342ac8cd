"""A run's facts for its goodput account, read from what fsdpctl already keeps: run.json (each
attempt's timeline, its failure, the spares it ran on), the hang watchdog's reports, and the rows the
ranks wrote (the bundled workload's ``metrics.jsonl``, the start-up hook's ``telemetry/node<R>.jsonl``:
windows of steps, checkpoint calls, evaluations). No node is asked anything here but for those files.

Clocks: the launcher's timeline and the ranks' rows are each on their own machine's clock; on hosts
kept in step by NTP they differ by milliseconds, which is what the account can be off by at an
attempt's edges (an attempt's start-up and tail take the difference). ``attempt_of`` gives a row
without an attempt number to the attempt whose span holds its time.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

from ..metrics.rank_windows import is_hook_row, merge_all
from ..metrics.rows import ATTEMPT_MARK, merge_step, parse_row, row_kind
from ..node.events import (
    CHECKPOINT_LOADED,
    CHECKPOINT_SAVED,
    CHECKPOINT_STAGED,
    CHECKPOINT_WAIT,
    EVALUATION,
    EVENT,
    PROGRAM_EXIT,
    STEPS_BEGIN,
    event_name,
)
from ..rundir.record import epoch
from ..rundir.state import RunState
from .account import AttemptFacts, RunFacts, Timed, Window

_TIMED_EVENTS = {CHECKPOINT_SAVED: "save", CHECKPOINT_STAGED: "save", CHECKPOINT_WAIT: "save",
                 CHECKPOINT_LOADED: "load", "checkpoint_state": None, EVALUATION: "eval"}


def read_rows(files: Iterable[Path]) -> list[dict[str, Any]]:
    """Every row and event of the files, each line once (nodes sharing a run directory fetch the
    same file), attempt lines dropped (rows are placed by their attempt or their time)."""
    seen: set[str] = set()
    rows = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if not line or line in seen:
                continue
            seen.add(line)
            row = parse_row(line)
            if row is not None and ATTEMPT_MARK not in row:
                rows.append(row)
    return rows


def _span(timeline: Optional[Mapping[str, Any]], started: Optional[str], finished: Optional[str]
          ) -> tuple[Optional[float], Optional[float], float, dict[str, float]]:
    """(begin, end, queued seconds, each node's exit) of an attempt on the launcher's clock: from its
    timeline, where it has one (after its wait in a scheduler's queue), else run.json's times."""
    begin, end = epoch(started), epoch(finished)
    queued, exits = 0.0, {}
    if timeline and isinstance(timeline.get("origin"), (int, float)):
        origin = float(timeline["origin"])
        phases = timeline.get("phases") or {}
        ends = [float(span[1]) for nodes in phases.values() for span in nodes.values()
                if isinstance(span, list) and len(span) == 2]
        begin = origin
        if "queued" in phases:
            queued = max(float(span[1]) for span in phases["queued"].values())
            begin = origin + queued
        if ends:
            end = max(end or 0.0, origin + max(ends))
        exits = {node: origin + float(span[1]) for node, span in (phases.get("exit") or {}).items()}
    return begin, end, queued, exits


def _hang_verdict(folder: Path) -> Optional[float]:
    """When the watchdog gave the verdict that ended an attempt (its report in ``folder``), if one did."""
    newest = None
    for report in folder.glob("hang*/report.json"):
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("began"), (int, float)):
            newest = max(newest or 0.0, float(data["began"]))
    return newest


def attempt_of(row: Mapping[str, Any], spans: list[tuple[int, float, float]]) -> int:
    """The attempt a row belongs to: its own number, else the attempt whose span holds its time (a
    time past every span: the newest attempt that began before it)."""
    number = row.get("attempt")
    if isinstance(number, int) and not isinstance(number, bool):
        return number
    at = row.get("time")
    if not isinstance(at, (int, float)):
        return spans[-1][0]
    for attempt, begin, end in spans:
        if begin <= at <= end:
            return attempt
    before = [attempt for attempt, begin, _ in spans if begin <= at]
    return before[-1] if before else spans[0][0]


def _windows(train: list[dict[str, Any]], from_step: int) -> list[Window]:
    """An attempt's windows of steps from its train rows (the bundled workload's, one row per
    window; the hook's merged over the ranks)."""
    windows: list[Window] = []
    previous = from_step
    first_step_s: Optional[float] = None
    for row in sorted(train, key=lambda r: r["step"]):
        at = row.get("time")
        if not isinstance(at, (int, float)) or row["step"] <= previous:
            continue
        steps = row.get("steps") if isinstance(row.get("steps"), int) else row["step"] - previous
        ranks = [r for r in row.get("ranks") or [] if isinstance(r, dict)]
        begin = None
        if row.get("source") == "hook" and isinstance(row.get("step_time_s"), (int, float)):
            begin = float(at) - steps * float(row["step_time_s"])  # a hook step runs from the last one's end
        if not windows:
            first_step_s = _own_step_s(row)
        windows.append(Window(end=float(at), steps=steps, last_step=row["step"], begin=begin,
                              data_s=_mean(ranks, "data_s"), comm_s=_mean(ranks, "comm_s"),
                              straggler_s=_straggler(ranks)))
        previous = row["step"]
    if windows and windows[0].begin is None:
        # where the first window began: its own step time, else the pace of the windows after it
        pace = [(later.end - earlier.end) / later.steps
                for earlier, later in zip(windows, windows[1:], strict=False) if later.steps > 0]
        step_s = first_step_s if first_step_s is not None else (statistics.median(pace) if pace else None)
        if step_s is not None:
            windows[0].estimated_begin = windows[0].end - windows[0].steps * step_s
    return windows


def _own_step_s(row: dict[str, Any]) -> Optional[float]:
    """A row's own time per step: its ``step_time_s``, else the median of its ranks' (None: neither)."""
    if isinstance(row.get("step_time_s"), (int, float)):
        return float(row["step_time_s"])
    said = [float(r["step_time_s"]) for r in row.get("ranks") or []
            if isinstance(r, dict) and isinstance(r.get("step_time_s"), (int, float))]
    return statistics.median(said) if said else None


def _merged(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Train rows by step: one writer's as they are (its newest of a step), several ranks' merged."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_step.setdefault(row["step"], []).append(row)
    return [merge_step(group) for _, group in sorted(by_step.items())]


def _mean(ranks: list[dict[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in ranks if isinstance(r.get(key), (int, float))]
    return statistics.fmean(values) if values else 0.0


def _straggler(ranks: list[dict[str, Any]]) -> float:
    """Per step, the slowest rank's compute over the median of the others': what they waited for it."""
    values = sorted(float(r["compute_s"]) for r in ranks if isinstance(r.get("compute_s"), (int, float)))
    return values[-1] - statistics.median(values[:-1]) if len(values) > 1 else 0.0


def _timed(events: list[dict[str, Any]], val: list[dict[str, Any]]) -> list[Timed]:
    out = []
    for row in events:
        name = event_name(row)
        if name not in _TIMED_EVENTS or not isinstance(row.get("seconds"), (int, float)):
            continue
        kind = _TIMED_EVENTS[name] or ("save" if row.get("side") == "save" else "load")
        written = name == CHECKPOINT_SAVED and bool(row.get("written"))
        if written:
            kind = "written"  # an async save's write behind the steps: blocked nobody, complete at its end
        began = row.get("began")
        if not isinstance(began, (int, float)):
            began = float(row.get("time") or 0.0) - float(row["seconds"])
        step = row.get("step") if isinstance(row.get("step"), int) else row.get("steps")
        is_async = bool(row.get("async")) or name in (CHECKPOINT_STAGED, CHECKPOINT_WAIT)
        out.append(Timed(float(began), float(row["seconds"]), kind, step if isinstance(step, int) else None,
                         is_async, complete=name == CHECKPOINT_SAVED and (written or not row.get("async")),
                         wait=name == CHECKPOINT_WAIT))
    for row in val:
        if isinstance(row.get("eval_s"), (int, float)) and isinstance(row.get("time"), (int, float)):
            out.append(Timed(float(row["time"]) - float(row["eval_s"]), float(row["eval_s"]), "eval", row["step"]))
    return out


def _durable(attempt: AttemptFacts, resumed_from: Optional[int]) -> None:
    """Where a failed attempt's work stopped counting: the end of the checkpoint the next attempt
    continues from (the bundled workload's step), else its last save (a program's: the steps its
    hook had counted then)."""
    saves = [t for t in attempt.timed if t.kind in ("save", "written") and t.end <= (attempt.failed_at or attempt.end)]
    if resumed_from is not None:
        match = [t for t in saves if t.step == resumed_from]
        if match:
            attempt.durable_at, attempt.durable_step = match[-1].end, resumed_from
        else:  # from an earlier attempt's checkpoint: every step of this one is thrown away
            attempt.durable_at, attempt.durable_step = None, resumed_from
        return
    full = [t for t in saves if t.complete and t.step is not None]
    if full:
        attempt.durable_at, attempt.durable_step = full[-1].end, full[-1].step


def run_facts(record: Any, plan: Any, root: Path, rows: list[dict[str, Any]], spares: int = 0) -> Optional[RunFacts]:
    """A run's facts (None: it has no timed attempt yet). ``record``: its RunRecord; ``rows``: every
    row of its files (``read_rows``); ``spares``: the hosts its profile holds as spares."""
    earlier = [(a.attempt, a.timeline, a.started_at, a.finished_at, a.state, a.from_step, a.replacements)
               for a in record.attempts]
    every = [*earlier, (record.attempt, record.timeline, record.started_at, record.finished_at, record.state,
                        record.from_step, record.replacements)]
    # Ranks per node: uneven nodes ("2+1") and GPU-counted ones ("gpu") count by the world they made.
    nproc = str(plan.nproc_per_node or 1)
    per_node = int(nproc) if nproc.isdigit() else (plan.world_size or plan.num_nodes) / max(1, plan.num_nodes)
    full = int(getattr(plan, "full_nodes", None) or plan.num_nodes)
    attempts: list[AttemptFacts] = []
    queued_total = 0.0
    used_spares = 0
    for number, timeline, started, finished, state, _, replacements in every:
        begin, end, queued, exits = _span(timeline, started, finished)
        if begin is None:
            continue
        queued_total += queued
        nodes = len(exits) or (plan.num_nodes if number == record.attempt else full)
        used_spares = max(used_spares, len(replacements or ()))
        held = max(full, nodes) * per_node + max(0, spares - used_spares) * per_node
        over = RunState.parse(str(state)).is_over if state is not None else False
        if not over and number == record.attempt:
            end = max(end or begin, time.time())  # a live attempt: to now
        attempts.append(AttemptFacts(number=number, begin=begin, end=end if end is not None else begin,
                                     ranks=round(nodes * per_node), held=held,
                                     failed=over and str(state) not in ("succeeded",),
                                     failed_at=min(exits.values()) if exits else None,
                                     node_exits=[(at, per_node) for at in exits.values()]))
    if not attempts:
        return None
    spans = [(a.number, a.begin, a.end) for a in attempts]
    by_attempt: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        kind = "event" if EVENT in row else ("hook" if is_hook_row(row) else row_kind(row))
        by_attempt.setdefault(attempt_of(row, spans), {}).setdefault(kind, []).append(row)
    resumed = {n: from_step for n, _, _, _, _, from_step, _ in every}
    for index, attempt in enumerate(attempts):
        mine = by_attempt.get(attempt.number, {})
        events = mine.get("event", [])
        # the start-up hook's windows where it wrote them (a program's own rows of the same steps say no more)
        train = merge_all(mine["hook"]) if mine.get("hook") else _merged(mine.get("train", []))
        attempt.windows = _windows(train, resumed.get(attempt.number) or 0)
        attempt.timed = _timed(events, mine.get("val", []))
        begun = [float(e["time"]) for e in events if event_name(e) == STEPS_BEGIN and isinstance(e.get("time"),
                                                                                                 (int, float))]
        attempt.steps_begin = begun[0] if begun else None
        left = [float(e["time"]) for e in events if event_name(e) == PROGRAM_EXIT and isinstance(e.get("time"),
                                                                                                 (int, float))]
        attempt.program_exit = left[-1] if left else None
        folder = root if attempt.number == record.attempt else root / "attempts" / str(attempt.number)
        if attempt.failed:
            attempt.hang_at = _hang_verdict(folder)
            following = attempts[index + 1].number if index + 1 < len(attempts) else None
            _durable(attempt, resumed.get(following) if following is not None and not plan.command else None)
    end = max(a.end for a in attempts)
    return RunFacts(begin=attempts[0].begin, end=end, attempts=attempts, queued_s=queued_total)
