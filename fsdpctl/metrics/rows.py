"""A run's ``metrics.jsonl`` read back into one series per figure, whoever wrote it.

The schema (docs in README, "Reports"): one JSON object per line, ``step`` required, everything else
optional: ``loss``, ``val_loss``, ``lr``, ``tokens_per_s``, ``mfu``, ``step_time_s``, ``mem_mb``, and
``ranks``: one entry per rank for the window the row closes (``rank``, ``node``, ``host``,
``compute_s``, ``comm_s``, ``data_s``, ``wall_s``, ``mem_mb``). The bundled workload writes all of
it from rank 0 (``kind``: ``train`` or ``val``). A program of the user's may write rows from every
rank into its own ``$FSDPCTL_RUN_DIR/metrics.jsonl`` with a ``rank`` field: rows of one step are
then merged, their per-rank figures gathered into ``ranks``, the loss averaged. fsdpctl's own rank
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


def parse_row(line: str) -> Optional[dict[str, Any]]:
    """A ``metrics.jsonl`` line as a row (a JSON object with an integer ``step``), an attempt line as
    it is, or None (not JSON, no step, or a line cut short when its writer died)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    if ATTEMPT_MARK in row:
        return row
    step = row.get("step")
    return row if isinstance(step, int) and not isinstance(step, bool) else None


def row_kind(row: dict[str, Any]) -> str:
    """``val`` for a validation row, else ``train``."""
    return "val" if row.get("kind") == "val" or ("val_loss" in row and "loss" not in row) else "train"


def read_rows(lines: Iterable[str], name: str) -> Series:
    """Parse ``metrics.jsonl`` lines into a Series, merging per-rank rows of a user's program (its
    own, and those of fsdpctl's rank telemetry)."""
    series = Series(name)
    by_step: dict[tuple[str, int], list[dict[str, Any]]] = {}
    seen: set[str] = set()
    hook_rows: list[dict[str, Any]] = []
    for line in lines:
        line = line.strip()
        if not line or line in seen:  # the same file fetched from nodes that share a run directory
            continue
        seen.add(line)
        row = parse_row(line)
        if row is None:
            series.skipped += 1
            continue
        if ATTEMPT_MARK in row:
            if isinstance(row.get("from_step"), int):
                by_step = {key: rows for key, rows in by_step.items() if key[1] <= row["from_step"]}
            continue
        if is_hook_row(row):  # counted from each attempt's start: an attempt's rows stand on their own
            hook_rows.append(row)
            continue
        by_step.setdefault((row_kind(row), row["step"]), []).append(row)
    for merged in merge_all(hook_rows):
        own = by_step.get(("train", merged["step"]))
        # the program's own row of the same step, where it writes one, has the last word on its figures
        by_step[("train", merged["step"])] = [{**merged, **own[-1]}] if own and "rank" not in own[-1] else [merged]
    for (kind, _step), rows in sorted(by_step.items(), key=lambda item: item[0][1]):
        if all("rank" not in r for r in rows):  # one writer (rank 0): a step written again is the newer
            merged = rows[-1]
        else:
            merged = merge_rank_rows(list({r.get("rank", 0): r for r in rows}.values()))  # per rank, its newest
        (series.val if kind == "val" else series.train).append(merged)
    return series


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


def read_run_files(files: list[Path], name: str, summary: Optional[Path] = None) -> Series:
    """A Series from the metrics.jsonl files of a run's nodes (one for the bundled workload)."""
    lines: list[str] = []
    for path in files:
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    series = read_rows(lines, name)
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
