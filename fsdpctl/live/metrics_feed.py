"""A run's metrics rows as they come, kept small: what a live view shows is the newest rows (curves,
ETA), each rank's newest windows (heat rows) and the straggler rule over the newest windows. Rows
are read once each; nothing grows with the run's length.

The rows are ``metrics.jsonl``'s (schema in ``fsdpctl.metrics.rows``): the bundled workload's from rank
0, or a program's own, one row per rank and step (``rank``), merged here once every rank's row of a
step is in (or two newer steps are); or fsdpctl's rank telemetry's, merged into windows every rank
shares (``fsdpctl.metrics.rank_windows``).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any, Optional

from ..metrics.rank_windows import RankWindows, is_hook_row
from ..metrics.rows import ATTEMPT_MARK, AttemptMarks, copy_key, merge_rank_rows, parse_row, row_kind
from ..metrics.wait_rule import straggler_verdict
from ..node.events import EVENT

HISTORY = 240
"""Training rows kept for the curves and the rate."""
WINDOWS = 32
"""Per-rank windows kept for the heat rows."""
RECENT = 16
"""The newest windows the live straggler verdict is made of."""
SEEN_LINES = 8192
"""Lines remembered to drop the same line read again (nodes that share a run directory each send it)."""
RATE_ROWS = 10
"""Rows the step rate (and so the ETA) is measured over."""
PENDING_SECONDS = 5.0
"""How long a step of a program's own per-rank rows waits for a rank that writes none for it (one
that stopped writing, or writes only now and then) before it goes out without it."""
PENDING_STEPS = 1024
"""Steps held at most, whatever the time (what a reader catching up holds, read copy by copy)."""
COMPACT = ("step", "loss", "tokens_per_s", "mfu", "time", "step_time_s", "lr", "epoch")


class MetricsFeed:
    """Rows in, the live view's figures out."""

    def __init__(self, world_size: Optional[int] = None,
                 on_row: Optional[Callable[[str, dict[str, Any]], None]] = None,
                 on_attempt: Optional[Callable[[int], None]] = None,
                 on_event: Optional[Callable[[dict[str, Any]], None]] = None):
        """``on_row``: told of every row taken (``train`` or ``val``, the row), in order: an exporter's.
        ``on_attempt``: told the step a later attempt resumed from (rows past it were the failed one's).
        ``on_event``: told of every event row (``fsdpctl.node.events``) as it is read."""
        self.world_size = world_size
        self.on_row = on_row
        self.on_attempt = on_attempt
        self.on_event = on_event
        self.train: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.val: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.last_train: Optional[dict[str, Any]] = None
        self.windows: deque[tuple[int, list[dict[str, Any]]]] = deque(maxlen=WINDOWS)
        self.hook = RankWindows(world_size)
        self.pending: dict[int, dict[int, dict[str, Any]]] = {}
        self.ranks_seen: set[int] = set()
        self.rank_newest: dict[int, int] = {}
        self.pending_since: dict[int, float] = {}
        self.behind = -1
        """The newest step of the rank furthest behind (its rows of later steps may still come)."""
        self.at_behind = 0
        """How many ranks seen are at ``behind``: it moves when the last of them moves on (counted
        again then, once a step, not once a row: 256 ranks made it 65,536 looks a step)."""
        self.seen: OrderedDict[int, None] = OrderedDict()
        self.straggler_said = False
        """The newest row carries the workload's own verdict (the bundled workload's rows do)."""
        self.skipped = 0
        self.rows = 0
        """Rows taken (all of them, not only those kept)."""
        self.hold = False
        """Per-rank rows wait for ``release`` (a reader of several copies calls it after each round)."""
        self.marks = AttemptMarks()
        self.resets = 0
        """Times the steps began again (a later attempt resumed from a step): with a row's step, where
        it stands in the run's rows (an exporter that goes on after another skips what that one wrote)."""

    # ---- rows in ---------------------------------------------------------------------------------
    def add_lines(self, lines: Iterable[str], source: Any = None) -> bool:
        """Take new lines of a copy of ``metrics.jsonl`` (``source``: which copy, its path; an
        attempt line applies to the rows of its own copy: ``AttemptMarks``); True when a row came."""
        took = False
        copy = copy_key(source) if source is not None else ""
        for line in lines:
            line = line.strip()
            if not line:
                continue
            if line.startswith('{"' + ATTEMPT_MARK):  # the collector's line: in every copy alike
                row = parse_row(line)
                if row is not None and (from_step := self.marks.mark(copy, row)) is not None:
                    self._attempt_began(from_step)
                took = True
                continue
            key = _line_key(line)
            if key in self.seen:
                continue
            self.seen[key] = None
            if len(self.seen) > SEEN_LINES:
                self.seen.popitem(last=False)
            row = parse_row(line)
            if row is None:
                self.skipped += 1
            elif ATTEMPT_MARK in row:
                if (from_step := self.marks.mark(copy, row)) is not None:
                    self._attempt_began(from_step)
                took = True
            elif EVENT in row:
                if self.on_event is not None:
                    self.on_event(row)
                took = True
            elif is_hook_row(row):
                attempt = self.hook.attempt
                merged = self.hook.add(row)
                if self.hook.attempt > attempt and attempt:
                    self._attempt_began(0)  # its steps are counted again from its start
                for window in merged:
                    self._row(window)
                took = True
            elif self.marks.stale(copy, row["step"]):
                took = True  # a failed attempt's row, trained again by a later one
            elif "rank" in row and isinstance(row.get("rank"), int):
                self._rank_row(row)
                took = True
            else:
                self._row(row)
                took = True
        return took

    def _rank_row(self, row: dict[str, Any]) -> None:
        """A program's own row of one rank: held until its step is whole, every rank's row in, or every
        rank seen has written a later step (a rank that writes no row for it: none will come). Each
        node's copy is read in turn, so a rank far ahead of the others is not a step given up on;
        ``PENDING_STEPS`` bounds what waits for a rank that stopped writing."""
        step, rank = row["step"], row["rank"]
        had = self.rank_newest.get(rank, -1)  # -1: not yet in this attempt
        self.rank_newest[rank] = newest = max(step, had)
        if rank not in self.ranks_seen:
            self.ranks_seen.add(rank)
            self._count_behind()
        elif had == self.behind and newest > had:  # one of those furthest behind moved on
            self.at_behind -= 1
            if self.at_behind <= 0:
                self._count_behind()
        if step not in self.pending:
            self.pending_since[step] = time.monotonic()
        self.pending.setdefault(step, {})[rank] = row
        if not self.hold:
            self.release()

    def _count_behind(self) -> None:
        newest = [self.rank_newest.get(r, -1) for r in self.ranks_seen]
        self.behind = min(newest, default=-1)
        self.at_behind = newest.count(self.behind)

    def release(self) -> None:
        """The program's own per-rank rows whose step is whole (or given up on) go out, in step order.
        A reader that reads each copy in turn holds them (``hold``) and releases them once a round of
        the copies is read: a rank whose copy comes later in the round is then seen, however many
        ranks the plan did not say."""
        if not self.pending:
            return
        world = self.world_size or len(self.ranks_seen)
        behind = self.behind if len(self.ranks_seen) >= world else -1  # a rank not seen yet is behind
        given_up = time.monotonic() - PENDING_SECONDS
        for waiting in sorted(self.pending):
            rows = self.pending[waiting]
            if (len(rows) >= world or waiting < behind or len(self.pending) > PENDING_STEPS
                    or self.pending_since.get(waiting, 0.0) < given_up):
                del self.pending[waiting]
                self.pending_since.pop(waiting, None)
                self._row(merge_rank_rows(list(rows.values())))
            else:
                break  # in step order: a later step waits for this one

    def _row(self, row: dict[str, Any]) -> None:
        self.rows += 1
        if self.on_row is not None:
            self.on_row(row_kind(row), row)
        if row_kind(row) == "val":
            self.val.append({k: row[k] for k in ("step", "val_loss", "time") if k in row})
            return
        self.train.append({k: row[k] for k in COMPACT if k in row})
        self.last_train = row
        self.straggler_said = "straggler" in row
        ranks = row.get("ranks")
        if isinstance(ranks, list) and ranks:
            entries = sorted((e for e in ranks if isinstance(e, dict)), key=lambda e: e.get("rank", 0))
            self.windows.append((row["step"], entries))

    def _attempt_began(self, from_step: Any) -> None:
        """A later attempt resumed from ``from_step``: the failed one's rows past it are gone."""
        if not isinstance(from_step, int):
            return
        self.resets += 1
        if self.on_attempt is not None:
            self.on_attempt(from_step)
        self.pending = {step: rows for step, rows in self.pending.items() if step <= from_step}
        self.pending_since = {step: since for step, since in self.pending_since.items() if step in self.pending}
        self.rank_newest = {}  # the ranks write their steps again from there
        self._count_behind()
        self.train = deque((r for r in self.train if r["step"] <= from_step), maxlen=HISTORY)
        self.val = deque((r for r in self.val if r["step"] <= from_step), maxlen=HISTORY)
        # The next attempt may run on other hosts (a spare in a lost one's place): the ranks' windows
        # begin again with it, and who straggled before says nothing of it.
        self.windows = deque(maxlen=WINDOWS)
        if self.last_train is not None and self.last_train["step"] > from_step:
            self.last_train = None
        self.straggler_said = False

    def state(self) -> dict[str, Any]:
        """What this reader holds that the rows to come depend on (plain data: ``restore`` takes it):
        the rows still waiting for the rest of their step, the lines remembered as read. Not the
        figures of rows already merged."""
        return {"pending": [[step, list(rows.values())] for step, rows in self.pending.items()],
                "ranks_seen": sorted(self.ranks_seen), "rank_newest": list(self.rank_newest.items()),
                "seen": list(self.seen), "hook": self.hook.state(),
                "skipped": self.skipped, "rows": self.rows, "marks": self.marks.state(), "resets": self.resets}

    def restore(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (``state()`` of the reader that read the lines before)."""
        self.pending = {int(step): {int(r["rank"]): r for r in rows} for step, rows in state["pending"]}
        self.pending_since = dict.fromkeys(self.pending, time.monotonic())  # the wait begins again
        self.ranks_seen = {int(r) for r in state["ranks_seen"]}
        self.rank_newest = {int(r): int(s) for r, s in state["rank_newest"]}
        self._count_behind()
        self.seen = OrderedDict((int(key), None) for key in state["seen"])
        self.hook.restore(state["hook"])
        self.skipped, self.rows = int(state["skipped"]), int(state["rows"])
        if "marks" in state:  # (an index written before attempts were told apart by copy has none)
            self.marks.restore(state["marks"])
        self.resets = int(state.get("resets") or 0)

    # ---- figures out -----------------------------------------------------------------------------
    @property
    def step(self) -> Optional[int]:
        return self.train[-1]["step"] if self.train else None

    def newest(self, key: str) -> Optional[float]:
        """The newest training row's ``key`` (None when it has none)."""
        value = self.train[-1].get(key) if self.train else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    @property
    def val_loss(self) -> Optional[float]:
        value = self.val[-1].get("val_loss") if self.val else None
        return float(value) if isinstance(value, (int, float)) else None

    def series(self, key: str, count: int = HISTORY) -> list[tuple[int, float]]:
        """(step, value) of the newest ``count`` training rows that have ``key``."""
        found = [(r["step"], float(r[key])) for r in self.train if isinstance(r.get(key), (int, float))
                 and not isinstance(r.get(key), bool)]
        return found[-count:]

    def seconds_per_step(self) -> Optional[float]:
        """Wall time per step over the newest rows (evaluations and checkpoints included: what the
        ETA is made of), else the rows' own step time."""
        timed = [(r["step"], float(r["time"])) for r in self.train if isinstance(r.get("time"), (int, float))]
        timed = timed[-RATE_ROWS:]
        if len(timed) >= 2 and timed[-1][0] > timed[0][0] and timed[-1][1] > timed[0][1]:
            return (timed[-1][1] - timed[0][1]) / (timed[-1][0] - timed[0][0])
        times = [v for _, v in self.series("step_time_s", RATE_ROWS)]
        return statistics.median(times) if times else None

    def straggler(self) -> Optional[dict[str, Any]]:
        """Who straggles now: the rule over the newest ``RECENT`` windows (a rank that turns slow late
        in a long run is named within a few windows; the workload's own verdict counts every window
        since its start); without per-rank windows, the workload's word in its newest row. None:
        nobody stands out."""
        recent = [entries for _, entries in list(self.windows)[-RECENT:]]
        if recent:
            return straggler_verdict(recent)
        row = self.last_train or {}
        if self.straggler_said and row.get("straggler"):
            where = row.get("straggler_at")
            return {**(where if isinstance(where, dict) else {}), "text": row["straggler"]}
        return None

    @property
    def world(self) -> int:
        return len(self.windows[-1][1]) if self.windows else 0


def _line_key(line: str) -> int:
    """A line's key among those read (the same in every process: a chart index keeps them)."""
    return int.from_bytes(hashlib.blake2b(line.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
