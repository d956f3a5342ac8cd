"""A run's ``metrics.jsonl`` read back into one series per figure, whoever wrote it.

The schema (docs/guides/watching.md, "Your own script's figures"): one JSON object per line, ``step``
required, everything else optional: ``loss``, ``val_loss``, ``lr``, ``tokens_per_s``, ``mfu``,
``step_time_s``, ``mem_mb``, and ``ranks``: one entry per rank for the window the row closes (``rank``,
``node``, ``host``, ``compute_s``, ``comm_s``, ``data_s``, ``wall_s``, ``mem_mb``). The bundled workload
writes all of it from rank 0 (``kind``: ``train`` or ``val``). A program of the user's may write rows
from every rank into its own ``$FSDPCTL_RUN_DIR/metrics.jsonl`` with a ``rank`` field: rows of one step
are then merged, their per-rank figures gathered into ``ranks``, the loss averaged. fsdpctl's own rank
telemetry (``source: hook``, a row per rank per window of ``steps``: ``fsdpctl.metrics.rank_windows``)
is merged into windows every rank shares.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..node.events import EVENT, event_name
from .rank_windows import is_hook_row, merge_all

PER_RANK = ("compute_s", "comm_s", "data_s", "wall_s", "mem_mb", "step_time_s")


@dataclass
class Series:
    """One run's figures by step (train rows and validation rows apart)."""

    name: str
    train: list[dict[str, Any]] = field(default_factory=list)
    val: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0
    """Lines that were not a JSON object with a step (a line cut short when its writer died)."""
    summary: Optional[dict[str, Any]] = None
    """The bundled workload's summary.json, where there is one."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """The ranks' event rows (``fsdpctl.node.events``), in the order read."""
    _windows: Optional[list[list[dict[str, Any]]]] = field(default=None, repr=False)

    def column(self, key: str, rows: Optional[list[dict[str, Any]]] = None) -> tuple[list[int], list[float]]:
        """(steps, values) of the rows that have ``key``."""
        rows = self.train if rows is None else rows
        pairs = [(r["step"], float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def windows(self) -> list[list[dict[str, Any]]]:
        """Per logged window, one entry per rank (ordered by rank); only windows with every rank."""
        if self._windows is None:
            out = [sorted(r["ranks"], key=lambda e: e.get("rank", 0)) for r in self.train if r.get("ranks")]
            width = max((len(w) for w in out), default=0)
            self._windows = [w for w in out if len(w) == width]
        return self._windows

    @property
    def world(self) -> int:
        windows = self.windows()
        return len(windows[0]) if windows else 0


ATTEMPT_MARK = "fsdpctl_attempt"
"""The key of the line the collector writes into its copy of a node's metrics when a later attempt
begins (``{"fsdpctl_attempt": 2, "from_step": 40}``): rows written before it past that step were the
failed attempt's, trained again by this one."""


class AttemptMarks:
    """Which rows of which copy a later attempt trained again. As an attempt begins, the collector
    writes its line (``ATTEMPT_MARK``) into every node's copy there is, and first into a copy it
    begins later: a row belongs to the attempt of the newest line before it in its copy (the first,
    before any line). Copies are read in turn, so one copy's rows of the new attempt may come before
    another copy's line: each copy's rows are judged by the lines read in that copy."""

    def __init__(self) -> None:
        self.newest = 1
        self.from_step: dict[int, int] = {}
        """Attempt -> the step it resumed from."""
        self.of_copy: dict[str, int] = {}
        """Copy -> the attempt its rows read now belong to."""

    def mark(self, copy: str, row: dict[str, Any]) -> Optional[int]:
        """An attempt line read in ``copy``: the step past which the rows read so far are the failed
        attempts' (None: the attempt was begun already, by another copy's line, or says no step)."""
        attempt, from_step = row.get(ATTEMPT_MARK), row.get("from_step")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            return None
        self.of_copy[copy] = max(attempt, self.of_copy.get(copy, 1))
        if attempt <= self.newest:
            return None
        self.newest = attempt
        if not isinstance(from_step, int):
            return None
        self.from_step[attempt] = from_step
        return from_step

    def stale(self, copy: str, step: int) -> bool:
        """A row of ``copy`` read before that copy's line of a newer attempt, past the step that
        attempt resumed from: the failed attempt's, trained again."""
        mine = self.of_copy.get(copy, 1)
        if mine >= self.newest:
            return False
        later = [s for attempt, s in self.from_step.items() if mine < attempt <= self.newest]
        return bool(later) and step > min(later)

    def state(self) -> dict[str, Any]:
        return {"newest": self.newest, "from_step": list(self.from_step.items()), "of_copy": list(self.of_copy.items())}

    def restore(self, state: dict[str, Any]) -> None:
        self.newest = int(state["newest"])
        self.from_step = {int(a): int(s) for a, s in state["from_step"]}
        self.of_copy = {str(c): int(a) for c, a in state["of_copy"]}


def copy_key(path: Any) -> str:
    """A copy's name among a run's copies (``node1/metrics.jsonl``, ``telemetry/node1.jsonl``): the
    same in every process, wherever the run directory is."""
    path = Path(path)
    return f"{path.parent.name}/{path.name}"


def parse_row(line: str) -> Optional[dict[str, Any]]:
    """A ``metrics.jsonl`` line as a row (a JSON object with an integer ``step``), an attempt line or
    an event (``fsdpctl.node.events``) as it is, or None (not JSON, no step, or a line cut short when
    its writer died)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    if ATTEMPT_MARK in row or EVENT in row:
        return row
    step = row.get("step")
    return row if isinstance(step, int) and not isinstance(step, bool) else None


def row_kind(row: dict[str, Any]) -> str:
    """``val`` for a validation row, else ``train``."""
    return "val" if row.get("kind") == "val" or ("val_loss" in row and "loss" not in row) else "train"


def read_rows(lines: Iterable[str], name: str) -> Series:
    """Parse ``metrics.jsonl`` lines (of one file) into a Series, merging per-rank rows of a user's
    program (its own, and those of fsdpctl's rank telemetry)."""
    return read_copies([lines], name)


def read_copies(copies: Iterable[Iterable[str]], name: str) -> Series:
    """``read_rows`` of several files' lines (each node's copy), each file's attempt lines applying
    to that file's rows (``AttemptMarks``)."""
    series = Series(name)
    by_step: dict[tuple[str, int], list[dict[str, Any]]] = {}
    seen: set[str] = set()
    hook_rows: list[dict[str, Any]] = []
    marks = AttemptMarks()
    for number, lines in enumerate(copies):
        copy = str(number)
        for line in lines:
            line = line.strip()
            if not line:
                continue
            row = parse_row(line)
            if row is not None and ATTEMPT_MARK in row:
                if (from_step := marks.mark(copy, row)) is not None:
                    by_step = {key: rows for key, rows in by_step.items() if key[1] <= from_step}
                continue
            if line in seen:  # the same file fetched from nodes that share a run directory
                continue
            seen.add(line)
            if row is None:
                series.skipped += 1
                continue
            if EVENT in row:
                series.events.append(row)
                continue
            if is_hook_row(row):  # counted from each attempt's start: an attempt's rows stand on their own
                hook_rows.append(row)
                continue
            if marks.stale(copy, row["step"]):
                continue
            by_step.setdefault((row_kind(row), row["step"]), []).append(row)
    for merged in merge_all(hook_rows):
        own = by_step.get(("train", merged["step"]))
        # the program's own row of the same step, where it writes one, has the last word on its figures
        by_step[("train", merged["step"])] = [{**merged, **own[-1]}] if own and "rank" not in own[-1] else [merged]
    for (kind, _step), rows in sorted(by_step.items(), key=lambda item: item[0][1]):
        (series.val if kind == "val" else series.train).append(merge_step(rows))
    return series


def merge_step(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows of one step as one: one writer's (rank 0) newest, for a step written again; several
    ranks' merged, each rank's newest."""
    if all("rank" not in r for r in rows):
        return rows[-1]
    return merge_rank_rows(list({r.get("rank", 0): r for r in rows}.values()))


def merge_rank_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of one step written by several ranks: per-rank figures into ``ranks``, scalars averaged."""
    merged: dict[str, Any] = {"step": rows[0]["step"]}
    keys = {k for r in rows for k in r if k not in ("rank", "step", "ranks")}
    for key in sorted(keys - set(PER_RANK)):
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        if values:
            merged[key] = statistics.fmean(values) if key != "tokens_per_s" else sum(values)
        else:
            merged[key] = next((r[key] for r in rows if key in r), None)
    ranks = []
    for r in sorted(rows, key=lambda r: r.get("rank", 0)):
        entry = {k: r[k] for k in (*PER_RANK, "node", "host") if k in r}
        entry["rank"] = r.get("rank", 0)
        if "compute_s" not in entry and "step_time_s" in entry:
            entry["compute_s"] = entry["step_time_s"]  # a user's own step time stands for compute
        ranks.append(entry)
    if any(len(e) > 1 for e in ranks):
        merged["ranks"] = ranks
    return merged


def read_event_rows(files: Iterable[Path], name: Optional[str] = None) -> list[dict[str, Any]]:
    """The event rows (``fsdpctl.node.events``) of a run's metrics files, each file's in its order, the
    files in turn; only the events called ``name`` where given. A file that cannot be read has none."""
    found = []
    for path in files:
        try:
            with path.open(encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if EVENT not in line:  # most lines are figures: not parsed
                        continue
                    row = parse_row(line)
                    if row is not None and event_name(row) is not None and name in (None, event_name(row)):
                        found.append(row)
        except OSError:
            continue
    return found


def read_run_files(files: list[Path], name: str, summary: Optional[Path] = None) -> Series:
    """A Series from the metrics.jsonl files of a run's nodes (one for the bundled workload)."""
    series = read_copies((path.read_text(encoding="utf-8", errors="replace").splitlines() for path in files), name)
    series.summary = read_workload_summary(summary)
    return series


def read_workload_summary(path: Optional[Path]) -> Optional[dict[str, Any]]:
    """The bundled workload's summary.json (None: none, or not readable as a JSON object)."""
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
