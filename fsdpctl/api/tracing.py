"""``fsdpctl profile RUN`` and ``Run.trace_steps``: chosen ranks' ``torch.profiler`` traces of the same
steps of a live run, merged into one trace with a summary beside it; and the same gathered for a run
launched with ``--profile-steps``.

The steps: the run's newest step (its rows) plus a lead of ``LEAD_S`` worth of steps, so the request
reaches every chosen rank before the first of them begins. A rank it reached late says so (``missed``),
and the request goes again once, with twice the lead, to every chosen rank. The files land in
``runs/<id>/profiles/<profile id>/``: ``trace.json.gz`` (every rank, for Perfetto), ``ranks/`` (each
rank's own trace, as HTA reads a folder of them), ``summary.json`` and ``summary.txt``.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

from ..diagnose.trace_merge import RankTrace, linked_collectives, merge, with_step_marks
from ..diagnose.trace_summary import PROFILES, summarize
from ..errors import UsageError

LEAD_S = 5.0
"""Seconds of steps between the newest step seen and the first profiled one."""
POLL_S = 1.0
FINAL = ("done", "missed", "refused", "ended", "failed", "busy")


@dataclass
class StepTrace:
    """A profile of a run: where its files are, the ranks' summary, and what did not go to plan."""

    run_id: str
    profile_id: str
    folder: Path
    ranks: list[int]
    steps: list[int]
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def trace(self) -> Path:
        """The merged trace (Chrome trace JSON, gzipped: Perfetto and chrome://tracing open it)."""
        return self.folder / "trace.json.gz"

    @property
    def ok(self) -> bool:
        return bool(self.summary.get("ranks"))

    def lines(self) -> list[str]:
        """What ``fsdpctl profile`` prints."""
        head = (f"profile {self.profile_id} of run {self.run_id}: steps {self.steps[0]}-{self.steps[-1]} on "
                f"rank(s) {', '.join(map(str, self.ranks))}" if self.steps else
                f"profile {self.profile_id} of run {self.run_id}: no trace came back")
        body = [f"  {line}" for line in self.summary.get("lines", [])]
        costs = [f"  {line}" for line in self.summary.get("cost_lines", [])]
        out = [head, *body, *costs, f"  {self.summary.get('verdict', '')}"]
        if self.ok:
            out += [f"  trace: {self.trace} (open it in https://ui.perfetto.dev or chrome://tracing)",
                    f"  each rank's own: {self.folder / 'ranks'} (HTA reads this folder)"]
        return out + [f"  note: {note}" for note in self.notes]


def profile_id_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def parse_ranks(spec: str, world: int) -> str:
    """``all``, ``auto``, ``straggler`` or a comma list of ranks below ``world`` (UsageError else)."""
    spec = spec.strip()
    if spec in ("all", "auto", "straggler"):
        return spec
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts) or (world and any(int(p) >= world for p in parts)):
        raise UsageError(f"--ranks: {spec!r} is not a list of ranks of this run ({world} ranks)",
                         "give e.g. 0,3, or all, auto or straggler")
    return ",".join(str(int(p)) for p in parts)


def choose_ranks(spec: str, summary: Any) -> tuple[list[int], list[str]]:
    """The ranks ``spec`` names, with why each (``auto``: the straggler, the two ranks nearest the
    median, and rank 0)."""
    world = int(getattr(summary, "world", 0) or 0)
    if spec == "all":
        return list(range(world)), []
    if spec not in ("auto", "straggler"):
        return [int(p) for p in spec.split(",")], []
    straggler = (getattr(summary, "straggler", None) or {}).get("rank")
    if spec == "straggler":
        if straggler is None:
            raise UsageError("--ranks straggler: this run has no straggler named (its ranks are even so far)",
                             "give --ranks all, auto or a list")
        return [int(straggler)], []
    from ..metrics.rank_table import own_time

    figures = [r for r in getattr(summary, "ranks", []) or [] if r.get("compute_s") is not None]
    chosen = {0}
    notes = []
    if straggler is not None:
        chosen.add(int(straggler))
    if figures:
        ordered = sorted(figures, key=own_time)
        middle = own_time(ordered[len(ordered) // 2])
        chosen |= {int(r["rank"]) for r in sorted(figures, key=lambda r: abs(own_time(r) - middle))[:2]}
    else:
        chosen |= set(range(min(world, 4)))
        notes.append("no per-rank figures yet: the first ranks were taken")
    return sorted(chosen), notes


def trace_steps(run: Any, *, steps: int = 3, ranks: str = "auto", shapes: bool = False, stack: bool = False,
                max_mb: float = 100.0, timeout: Optional[float] = None) -> StepTrace:
    """Profile ``steps`` steps of the live ``run`` on ``ranks`` (see the module's text)."""
    from .summaries import run_series

    if run.info.state.is_over:
        raise UsageError(f"run {run.run_id} is {run.info.state}: no rank is left to profile",
                         "launch it again with --profile-steps A-B to profile steps from its start")
    if not 1 <= steps <= 100:
        raise UsageError(f"--steps: {steps} is outside 1-100", "give the steps to record, e.g. 3")
    try:
        _series, summary = run_series(run, fetch=False)
    except Exception as exc:  # noqa: BLE001 - a run with no rows yet
        raise UsageError(f"run {run.run_id}: no step seen yet ({exc})",
                         "try again once the run has taken a few steps") from None
    if not summary.steps:
        raise UsageError(f"run {run.run_id}: no step seen yet", "try again once the run has taken a few steps")
    spec = parse_ranks(ranks, int(summary.world or 0))
    chosen, notes = choose_ranks(spec, summary)
    newest, step_s = newest_step(run, int(summary.steps), float(summary.step_time_s or 1.0))
    summary.steps = newest
    lead = max(2, math.ceil(LEAD_S / max(step_s, 1e-3)))
    offsets = run.backend.clock_offsets(run._dir)
    base = profile_id_now()
    for attempt in (1, 2):
        ident = base if attempt == 1 else f"{base}-again"
        start = int(summary.steps) + lead * attempt
        request = {"id": ident, "start": start, "steps": steps, "shapes": shapes, "stack": stack, "max_mb": max_mb}
        answers = run.backend.profile_request(run._dir, json.dumps(request), ",".join(map(str, chosen)))
        reached = {r["rank"] for a in answers for r in a.get("ranks", []) if r.get("sent")}
        notes += [f"{a['host']}: {a['error']}" for a in answers if a.get("error")]
        notes += [f"rank {r['rank']} on {a['host']}: {r['error']}" for a in answers for r in a.get("ranks", [])
                  if r.get("error")]
        found = {r["rank"] for a in answers for r in a.get("ranks", [])}
        notes += [f"rank {r}: not running on any node" for r in chosen if r not in found]
        wait = timeout if timeout is not None else 60.0 + 3 * (lead * attempt + steps) * step_s
        statuses = wait_for(run, ident, reached, wait)
        if not any(s.get("state") == "missed" for s in statuses.values()) or attempt == 2:
            break
        notes.append(f"the request reached a rank after step {start}: asked again with a lead of "
                     f"{2 * lead} steps")
        now_at = newest_step(run, int(summary.steps), step_s)[0]  # steps went on while the others recorded
        summary.steps = max([int(s.get("arrived_at_step") or 0) for s in statuses.values()] + [now_at])
    return gather(run, ident, statuses, offsets, notes, expected=reached)


def newest_step(run: Any, seen: int, step_s: float) -> tuple[int, float]:
    """The step the run is at now and a step's seconds: the newest row of its metrics copies here (the
    chart index lags them), carried on by the time since that row at its step time."""
    from ..live import layout
    from ..metrics.gpu_samples import newest_text

    newest: tuple[int, float, float] = (seen, 0.0, step_s)
    for path in layout.metrics_files(run.path, run.plan):
        for line in reversed(newest_text(path, 64 << 10).splitlines()):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("kind") == "train" and isinstance(row.get("step"), int):
                wall = row.get("wall_s") or row.get("step_time_s") or step_s
                newest = max(newest, (row["step"], float(row.get("time") or 0.0), float(wall)))
                break
    step, at, wall = newest
    behind = math.floor((time.time() - at) / max(wall, 1e-3)) if at else 0
    return step + max(0, behind), wall


def wait_for(run: Any, ident: str, ranks: set[int], seconds: float) -> dict[int, dict[str, Any]]:
    """Every rank's status of profile ``ident`` once each has one that is final, the run has ended,
    or ``seconds`` passed: what came by then."""
    deadline = time.monotonic() + seconds
    statuses: dict[int, dict[str, Any]] = {}
    while True:
        statuses = _statuses(run, ident)
        over = run.info.state.is_over
        if all(statuses.get(r, {}).get("state") in FINAL for r in ranks) or over or time.monotonic() > deadline:
            return statuses if not over else _statuses(run, ident)
        time.sleep(POLL_S)


def _statuses(run: Any, ident: str) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for files in run.fetch(f"profile/{ident}/status").values():
        for name in files:
            if name.endswith(".json"):
                try:
                    data = json.loads(Path(name).read_text())
                except (OSError, ValueError):
                    continue
                found[int(data.get("rank", -1))] = data
    return found


def gather(run: Any, ident: str, statuses: dict[int, dict[str, Any]], offsets: dict[str, dict[str, Any]],
           notes: list[str], expected: set[int]) -> StepTrace:
    """The traces of profile ``ident`` brought here, merged and summed up into ``runs/<id>/profiles/<ident>``."""
    folder = Path(run.path) / PROFILES / ident
    (folder / "ranks").mkdir(parents=True, exist_ok=True)
    traces: list[RankTrace] = []
    for files in run.fetch(f"profile/{ident}").values():
        for name in files:
            if not name.endswith(".json.gz"):
                continue
            rank = int(Path(name).name[len("rank"):-len(".json.gz")])
            if rank in {t.rank for t in traces}:
                continue  # nodes that share one run directory bring the same files
            status = statuses.get(rank, {})
            clock = offsets.get(str(status.get("host")), {})
            if clock.get("error"):
                notes.append(f"{status.get('host')}: its clock was not measured ({clock['error']}): taken as this "
                             "machine's")
            try:
                trace = json.loads(gzip.decompress(Path(name).read_bytes()))
            except (OSError, ValueError, EOFError) as exc:
                notes.append(f"rank {rank}: its trace cannot be read ({exc})")
                continue
            found = RankTrace(rank, str(status.get("host") or "?"), trace, status, applied_offset(clock),
                              clock.get("error_ns"))
            with gzip.open(folder / "ranks" / f"rank{rank}.json.gz", "wt") as handle:
                json.dump(with_step_marks(found), handle)
            traces.append(found)
    for rank in sorted(expected):
        status = statuses.get(rank)
        if status is None:
            notes.append(f"rank {rank}: no answer (its node's disk may be full, or the rank hung)")
        elif status.get("state") != "done":
            notes.append(f"rank {rank}: {status.get('state')}: {status.get('why')}")
        elif status.get("cut"):
            cut = status["cut"]
            notes.append(f"rank {rank}: its trace was cut to its first {cut['events_kept']} of {cut['events']} "
                         f"events (over {status.get('max_mb', 'the')} MB gzipped)")
    summary = summarize(traces)
    summary["cost_lines"] = cost_lines(traces)
    merged = merge(traces, {"run_id": run.run_id, "profile_id": ident, "verdict": summary["verdict"],
                            "clock_offsets": offsets})
    summary["linked_collectives"] = linked_collectives(merged)
    with gzip.open(folder / "trace.json.gz", "wt") as handle:
        json.dump(merged, handle)
    steps = sorted({s for t in traces for s, _, _ in t.steps()})
    result = StepTrace(run.run_id, ident, folder, sorted(t.rank for t in traces), steps, summary, notes)
    summary["notes"] = notes
    (folder / "summary.json").write_text(json.dumps({**summary, "profile_id": ident, "steps": steps,
                                                     "ranks_profiled": result.ranks}, indent=1))
    (folder / "summary.txt").write_text("\n".join(result.lines()) + "\n")
    return result


def applied_offset(clock: dict[str, Any]) -> int:
    """A node's clock offset as the merge takes it off: the measured one where it is larger than how far
    the measurement may be off, else none. An SSH round trip is lopsided (the channel is opened before the
    node reads its clock, the answer comes straight back), so an offset within it says nothing: nodes kept
    in step by NTP would be set apart by the measurement's own error."""
    offset, error = int(clock.get("offset_ns") or 0), int(clock.get("error_ns") or 0)
    return offset if abs(offset) > error else 0


def cost_lines(traces: list[RankTrace]) -> list[str]:
    """The profiled steps' time against the same rank's steps before them."""
    lines = []
    for trace in sorted(traces, key=lambda t: t.rank):
        before = trace.status.get("unprofiled_step_s")
        steps = trace.steps()
        if before and steps:
            during = sum(end - start for _, start, end in steps) / len(steps) / 1e6
            lines.append(f"cost on rank {trace.rank}: a profiled step took {during / before:.2f}x an unprofiled one "
                         f"({during * 1e3:.1f} vs {before * 1e3:.1f} ms)")
    return lines


def gather_launched(run: Any) -> Optional[StepTrace]:
    """The profile of a run launched with ``--profile-steps``, gathered once it has ended (None: none asked)."""
    steps = (run.plan.env or {}).get("FSDPCTL_PROFILE_STEPS")
    if not steps:
        return None
    ident = f"launch-attempt{run.attempt}"
    statuses = _statuses(run, ident)
    return gather(run, ident, statuses, run.backend.clock_offsets(run._dir), [], expected=set(statuses))
