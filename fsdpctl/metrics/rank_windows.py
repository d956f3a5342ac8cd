"""The rows fsdpctl's start-up hook writes for every rank of a user's program, merged into windows
every rank shares.

Each rank writes a row per window of its steps (``step``: the window's last step, ``steps``: how many;
``fsdpctl.node.telemetry.windows``), and the ranks need not have chosen the same windows. A window
is merged once every rank has a row ending at the same step: from the last such step to this one,
each rank's rows are added up (figures per step, weighted by their steps), and the ranks' figures
stand side by side in ``ranks`` as the bundled workload's do. A rank's rows stand for one attempt;
rows of a newer attempt (the step count begins again with it) replace what was there.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any, Optional

PER_STEP = ("wall_s", "data_s", "comm_s", "compute_s", "gpu_step_s")
PLACE = ("rank", "node", "host", "local_rank")
HELD_ROWS = 4096
"""Rows a rank may have waiting for the others; past that its oldest go (a rank that stopped writing)."""


def is_hook_row(row: dict[str, Any]) -> bool:
    return row.get("source") == "hook" and isinstance(row.get("rank"), int) and isinstance(row.get("steps"), int)


class RankWindows:
    """Hook rows in (``add``), merged rows out, in step order."""

    def __init__(self, world: Optional[int] = None):
        self.world = world
        self.pending: dict[int, list[dict[str, Any]]] = {}
        self.attempt = 0
        self.merged_to = 0

    def add(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Take one rank's row; the windows it completes."""
        attempt = int(row.get("attempt") or 1)
        if attempt < self.attempt:
            return []
        if attempt > self.attempt:
            self.attempt, self.pending, self.merged_to = attempt, {}, 0
        mine = self.pending.setdefault(row["rank"], [])
        if row["step"] <= (mine[-1]["step"] if mine else self.merged_to):
            return []  # read again (a copy sent twice), or already merged
        mine.append(row)
        if len(mine) > HELD_ROWS:
            del mine[0]
        return self._merge(self.world or len(self.pending))

    def state(self) -> dict[str, Any]:
        """The rows still waiting for a window every rank shares, as plain data (``restore``)."""
        return {"attempt": self.attempt, "merged_to": self.merged_to,
                "pending": [[rank, rows] for rank, rows in self.pending.items()]}

    def restore(self, state: dict[str, Any]) -> None:
        self.attempt, self.merged_to = int(state["attempt"]), int(state["merged_to"])
        self.pending = {int(rank): list(rows) for rank, rows in state["pending"]}

    def rest(self) -> list[dict[str, Any]]:
        """At the end of what there is to read: the windows that the ranks with rows left share (a
        rank that stopped writing early is missing from them)."""
        return self._merge(0, only_waiting=True)

    def _merge(self, world: int, only_waiting: bool = False) -> list[dict[str, Any]]:
        ranks = [rank for rank, rows in self.pending.items() if rows or not only_waiting]
        if not ranks or len(ranks) < world or not all(self.pending[rank] for rank in ranks):
            return []
        ends = set.intersection(*({r["step"] for r in self.pending[rank]} for rank in ranks))
        out = []
        for end in sorted(ends):
            windows = {}
            for rank in ranks:
                rows = self.pending[rank]
                count = next(i for i, r in enumerate(rows) if r["step"] == end) + 1
                windows[rank], self.pending[rank] = rows[:count], rows[count:]
            out.append(merge_window(self.merged_to, end, windows))
            self.merged_to = end
        return out


def _weighted(rows: list[dict[str, Any]], key: str) -> Optional[float]:
    if not all(isinstance(r.get(key), (int, float)) for r in rows):
        return None
    steps = sum(r["steps"] for r in rows)
    return sum(r[key] * r["steps"] for r in rows) / steps if steps else None


def rank_entry(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's figures over its rows of a window (per step), as a window's ``ranks`` entry."""
    entry: dict[str, Any] = {k: rows[-1][k] for k in PLACE if k in rows[-1]}
    entry["timing"] = "hook"
    for key in PER_STEP:
        value = _weighted(rows, key)
        if value is not None:
            entry[key] = round(value, 6)
    mems = [r["mem_mb"] for r in rows if isinstance(r.get("mem_mb"), (int, float))]
    if mems:
        entry["mem_mb"] = max(mems)
    steps = sum(r["steps"] for r in rows)
    if steps and any(isinstance(r.get("untimed_ops"), (int, float)) for r in rows):
        # A rank writes untimed_ops only for a window in which some ran: a row without it had none.
        entry["untimed_ops"] = round(sum(float(r.get("untimed_ops") or 0.0) * r["steps"] for r in rows) / steps, 2)
    if rows[-1].get("comm"):
        entry["comm"] = rows[-1]["comm"]
    return entry


def merge_window(begin: int, end: int, windows: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Steps ``begin+1..end`` of every rank (``windows``: its rows there) as one metrics row."""
    merged: dict[str, Any] = {"step": end, "steps": end - begin, "kind": "train", "source": "hook"}
    ranks = [rank_entry(windows[rank]) for rank in sorted(windows)]
    merged["ranks"] = ranks
    losses = [v for rows in windows.values() if (v := _weighted_loss(rows)) is not None]
    if losses:
        merged["loss"] = statistics.fmean(losses)
    rates = [_tokens_per_s(rows) for rows in windows.values()]
    if any(rate is not None for rate in rates):
        merged["tokens_per_s"] = round(sum(rate or 0.0 for rate in rates), 1)
        merged["tokens"] = next((r["tokens"] for rows in windows.values() for r in rows if r.get("tokens")),
                                "estimated")
    mfus = [v for rows in windows.values() if (v := _weighted(rows, "mfu")) is not None]
    if mfus:
        merged["mfu"] = round(statistics.fmean(mfus), 4)
    walls = [e["wall_s"] for e in ranks if "wall_s" in e]
    if walls:
        merged["step_time_s"] = round(statistics.median(walls), 6)
    times = [r["time"] for rows in windows.values() for r in rows if isinstance(r.get("time"), (int, float))]
    if times:
        merged["time"] = max(times)
    comm = {e.get("comm") for e in ranks}
    if len(comm) == 1 and None not in comm:
        merged["comm"] = comm.pop()
    return merged


def _weighted_loss(rows: list[dict[str, Any]]) -> Optional[float]:
    known = [r for r in rows if isinstance(r.get("loss"), (int, float))]
    return _weighted(known, "loss") if known else None


def _tokens_per_s(rows: list[dict[str, Any]]) -> Optional[float]:
    if not any(isinstance(r.get("tokens_per_s"), (int, float)) for r in rows):
        return None
    tokens = sum(float(r.get("tokens_per_s") or 0.0) * r["wall_s"] * r["steps"] for r in rows)
    wall = sum(r["wall_s"] * r["steps"] for r in rows)
    return tokens / wall if wall > 0 else None


def merge_all(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every hook row of a run (each rank's in its own order; the ranks in any order), merged: the
    newest attempt's, over the ranks that wrote in it."""
    rows = list(rows)
    newest = max((int(r.get("attempt") or 1) for r in rows), default=1)
    mine = [r for r in rows if int(r.get("attempt") or 1) == newest]
    windows = RankWindows(len({r["rank"] for r in mine}))
    out = []
    for row in mine:
        out += windows.add(row)
    return out + windows.rest()
