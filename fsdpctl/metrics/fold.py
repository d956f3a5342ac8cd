"""A run's report figures folded row by row, so ``fsdpctl report`` of a run of any length reads a few
MB (the run's chart index keeps a fold: ``fsdpctl.live.chart_index``) instead of its GBs of metrics.

What a summary needs of each row is kept as it comes: the training rows' loss, tokens/s, MFU and
step time, the validation losses, and of each window of per-rank timings what the straggler rules
judge in it (the compute rule's slow ranks, the wait rule's culprit, the spreads and gaps the "ranks
even" lines take medians of, the step's wall time), plus the newest window's entries. A few numbers per
row (a 128-rank row is 20 KB of JSON; its fold, about 100 bytes); each rank's figures over the run are
sums kept per rank (``fsdpctl.metrics.rank_figures``), not per window. ``summarize`` of a read
``Series`` is made by the same code, so a report from the fold and one from the files say the same.

A later attempt that resumes from a step drops what the fold kept past it (``truncate``), as the
reader of the files drops those rows.
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Optional

from ..node.events import EVENT, STEPS_UNSEEN
from ..workload.straggler import Tally, even_text_from, slow_ranks, spread_of
from .rank_figures import RankFigures
from .wait_rule import timed_from_outside, wait_even_from, wait_gap, wait_verdict_from, window_culprit

TRAIN = ("loss", "tokens_per_s", "mfu", "step_time_s", "val_loss")
WINDOW = ("width", "counted", "spread", "culprit", "slow_in_input", "by", "gap", "wall")
NAN = float("nan")
ONE_RANK_TEXT = "a single rank, with no other rank to compare its timings with"
KEPT = ("rank", "node", "host", "local_rank", "wall_s", "mem_mb", "timing", "comm", "compute_s", "comm_s", "data_s",
        "untimed_ops")
"""Of the newest window's entries, what a verdict names or a summary shows."""


def _number(value: Any) -> tuple[float, int]:
    """A row's figure as the reader of the files takes it (``Series.column``), and whether it has one
    (a loss that went NaN is a figure, kept as such)."""
    return (float(value), 1) if isinstance(value, (int, float)) else (0.0, 0)


def _present(value: float) -> bool:
    return value == value


def unseen_text(unseen: Mapping[int, Mapping[str, Any]]) -> str:
    """What the report says of ranks whose steps the start-up hook could not see."""
    ranks = sorted(unseen)
    named = ", ".join(f"{r}" + (f" on {unseen[r]['host']}" if unseen[r].get("host") else "") for r in ranks[:4])
    more = f" and {len(ranks) - 4} more" if len(ranks) > 4 else ""
    return (f"steps not seen on rank{'s' if len(ranks) > 1 else ''} {named}{more}: backward ran, but no optimizer "
            "step of torch's ended where fsdpctl can see it (the step runs inside torch.compile, or its optimizer "
            "is no torch.optim.Optimizer); its steps are not timed")


class Fold:
    """Rows in (``add``), a run's summary out (``summary``)."""

    def __init__(self) -> None:
        self.train_steps, self.val_steps, self.window_steps = array("q"), array("q"), array("q")
        self.train = {key: array("d") for key in TRAIN}
        self.has = {key: array("b") for key in TRAIN}
        self.val_loss, self.val_has = array("d"), array("b")
        self.windows = {key: array("d") for key in WINDOW}
        self.slow_window, self.slow_rank, self.slow_ratio = array("q"), array("q"), array("d")
        self.last: dict[int, list[dict[str, Any]]] = {}
        """Width (ranks in a window) -> the entries of the newest window that wide."""
        self.last_counted: dict[int, list[dict[str, Any]]] = {}
        """The same, of the windows the compute rule counts (every rank timed)."""
        self.rank_figures = RankFigures()
        """Each rank's figures over the windows, for the report's per-rank table."""
        self.unseen: dict[int, dict[str, Any]] = {}
        """Rank -> where it ran, of the ranks whose steps the start-up hook could not see
        (``fsdpctl.node.events.STEPS_UNSEEN``)."""

    @classmethod
    def of_rows(cls, train: Sequence[Mapping[str, Any]], val: Sequence[Mapping[str, Any]],
                events: Sequence[Mapping[str, Any]] = ()) -> Fold:
        fold = cls()
        for row in train:
            fold.add("train", row)
        for row in val:
            fold.add("val", row)
        for row in events:
            fold.event(row)
        return fold

    def event(self, row: Mapping[str, Any]) -> None:
        """A rank's event row (``fsdpctl.node.events``): what the report says of it is kept."""
        if row.get(EVENT) == STEPS_UNSEEN and isinstance(row.get("rank"), int):
            self.unseen[row["rank"]] = {k: row.get(k) for k in ("rank", "node", "host", "backward")}

    # ---- rows in ---------------------------------------------------------------------------------
    def add(self, kind: str, row: Mapping[str, Any]) -> None:
        """One merged row (``train`` or ``val``), in step order within an attempt."""
        step = int(row["step"])
        if kind == "val":
            self.val_steps.append(step)
            value, has = _number(row.get("val_loss"))
            self.val_loss.append(value)
            self.val_has.append(has)
            return
        self.train_steps.append(step)
        for key in TRAIN:
            value, has = _number(row.get(key))
            self.train[key].append(value)
            self.has[key].append(has)
        ranks = row.get("ranks")
        if isinstance(ranks, list) and ranks:
            steps = row.get("steps")
            if not isinstance(steps, int) or steps < 1:  # no "steps" (the workload's rows): since the window before
                steps = step - (self.window_steps[-1] if self.window_steps else 0)
            entries = sorted((e for e in ranks if isinstance(e, dict)), key=lambda e: e.get("rank", 0))
            if entries:
                self.rank_figures.add(step, steps, entries)
            self._window(step, entries)

    def _window(self, step: int, entries: list[dict[str, Any]]) -> None:
        width = len(entries)
        counted = width >= 2 and all(e.get("compute_s") is not None for e in entries)
        culprit = window_culprit(entries)
        walls = [e["wall_s"] for e in entries if "wall_s" in e]
        spread, gap = spread_of(entries), wait_gap(entries)
        figures = {"width": width, "counted": 1.0 if counted else 0.0, "spread": NAN if spread is None else spread,
                   "culprit": -1.0 if culprit is None else culprit[0],
                   "slow_in_input": 1.0 if culprit is not None and culprit[1] == "input" else 0.0,
                   "by": NAN if culprit is None else culprit[2], "gap": NAN if gap is None else gap,
                   "wall": statistics.median(walls) if walls and len(walls) == width else NAN}
        index = len(self.window_steps)
        self.window_steps.append(step)
        for key in WINDOW:
            self.windows[key].append(float(figures[key]))
        if counted:
            for rank, ratio in slow_ranks([float(e["compute_s"]) for e in entries]).items():
                self.slow_window.append(index)
                self.slow_rank.append(rank)
                self.slow_ratio.append(ratio)
        kept = [{k: e[k] for k in KEPT if k in e} for e in entries]
        self.last[width] = kept
        if counted:
            self.last_counted[width] = kept

    def truncate(self, step: int) -> None:
        """A later attempt resumed from ``step``: forget the rows past it (the failed attempt's)."""
        def keep(steps: array) -> int:
            return next((i for i, s in enumerate(steps) if s > step), len(steps))

        train, val, windows = keep(self.train_steps), keep(self.val_steps), keep(self.window_steps)
        del self.train_steps[train:], self.val_steps[val:], self.window_steps[windows:]
        del self.val_loss[val:], self.val_has[val:]
        for values in (*self.train.values(), *self.has.values()):
            del values[train:]
        for values in self.windows.values():
            del values[windows:]
        slow = next((i for i, w in enumerate(self.slow_window) if w >= windows), len(self.slow_window))
        del self.slow_window[slow:], self.slow_rank[slow:], self.slow_ratio[slow:]
        self.rank_figures.truncate(step)

    # ---- a summary out ---------------------------------------------------------------------------
    def column(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the training rows with ``key`` (``val_loss``: the validation rows',
        where there are any)."""
        if key == "val_loss" and self.val_steps:
            steps, values, has = self.val_steps, self.val_loss, self.val_has
        else:
            steps, values, has = self.train_steps, self.train[key], self.has[key]
        pairs = [(s, v) for s, v, h in zip(steps, values, has, strict=True) if h]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    @property
    def world(self) -> int:
        """Ranks in the widest window (the windows the summary judges: every rank in them)."""
        return int(max(self.windows["width"], default=0))

    def figures(self, workload_summary: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
        """The run's figures, as ``RunSummary`` has them (``fsdpctl.metrics.summary.summary_of``);
        ``workload_summary``: the bundled workload's summary.json, for what the rows leave out."""
        out = SimpleNamespace(steps=None, final_loss=None, best_loss=None, best_loss_step=None, final_val_loss=None,
                              best_val_loss=None, memory_mb_per_rank=[])
        steps, losses = self.column("loss")
        if losses:
            out.steps, out.final_loss = steps[-1], losses[-1]
            best = min(range(len(losses)), key=losses.__getitem__)
            out.best_loss, out.best_loss_step = losses[best], steps[best]
        _, val = self.column("val_loss")
        if val:
            out.final_val_loss, out.best_val_loss = val[-1], min(val)
        out.tokens_per_s = _median(self.column("tokens_per_s")[1])
        out.mfu = _median(self.column("mfu")[1])
        world = self.world
        judged = [i for i, w in enumerate(self.windows["width"]) if w == world] if world else []
        walls = [w for i in judged if _present(w := self.windows["wall"][i])]
        out.step_time_s = _median(self.column("step_time_s")[1]) or _median(walls)
        extra = workload_summary or {}
        if out.step_time_s is None and extra:
            out.step_time_s = extra.get("median_step_time_s")
        if out.step_time_s is None and out.tokens_per_s and extra.get("tokens_per_step"):
            out.step_time_s = extra["tokens_per_step"] / out.tokens_per_s
        out.world = world or int(extra.get("world_size") or 0)
        last = self.last.get(world, []) if judged else []
        if last and all("mem_mb" in e for e in last):
            out.memory_mb_per_rank = [float(e["mem_mb"]) for e in last]
        elif extra.get("peak_memory_mb_per_rank"):
            out.memory_mb_per_rank = [float(v) for v in extra["peak_memory_mb_per_rank"]]
        verdict, even = self._verdict(judged, last, world) if judged else (None, None)
        out.straggler = verdict
        out.ranks_text = None if verdict else even
        if out.ranks_text is None and judged and world == 1:
            out.ranks_text = ONE_RANK_TEXT
        out.ranks = self._each_rank(world, last, verdict) if judged else []
        out.unseen_text = unseen_text(self.unseen) if self.unseen else None
        return vars(out)

    def _each_rank(self, world: int, last: list[dict[str, Any]],
                   verdict: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every rank of the judged windows: where it ran (as the newest window says) and its figures
        over them (``RankFigures.figures``); ``straggler``: the verdict names it."""
        figures = self.rank_figures.figures(world)
        if len(figures) != len(last):
            return []  # (not kept: a chart index written before they were)
        named = set(verdict["ranks"]) if verdict else set()
        out = []
        for position, (entry, mine) in enumerate(zip(last, figures, strict=True)):
            rank = entry.get("rank", position)
            out.append({"rank": rank, "node": entry.get("node"), "host": entry.get("host"),
                        "local_rank": entry.get("local_rank"), **mine, "straggler": rank in named})
        return out

    def _verdict(self, judged: list[int], last: list[dict[str, Any]],
                 world: int) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        """The straggler rule the windows call for, over the judged windows; and its "ranks even" line."""
        figures = self.windows
        if timed_from_outside([last]):
            seen = len(judged) if world >= 2 else 0
            flagged: dict[int, list[tuple[str, float]]] = {}
            for i in judged:
                if figures["culprit"][i] >= 0:
                    kind = "input" if figures["slow_in_input"][i] else "compute"
                    flagged.setdefault(int(figures["culprit"][i]), []).append((kind, figures["by"][i]))
            where = dict(enumerate(last)) if world >= 2 else {}
            gaps = [g for i in judged if _present(g := figures["gap"][i])]
            return wait_verdict_from(seen, flagged, where), wait_even_from(last, gaps)
        tally = Tally()
        counted = {i for i in judged if figures["counted"][i]}
        tally.seen = len(counted)
        for window, rank, ratio in zip(self.slow_window, self.slow_rank, self.slow_ratio, strict=True):
            if window in counted:
                tally.slow.setdefault(rank, []).append(ratio)
        tally.where = dict(enumerate(self.last_counted.get(world, []))) if counted else {}
        spreads = [s for i in judged if _present(s := figures["spread"][i])]
        return tally.verdict(), even_text_from(spreads)

    # ---- kept in the chart index -----------------------------------------------------------------
    def state(self, put: Callable[[array], int]) -> dict[str, Any]:
        """Plain data, its arrays handed to ``put`` (which says where they are kept)."""
        return {"arrays": {name: put(values) for name, values in self._arrays().items()},
                "last": [[w, e] for w, e in self.last.items()],
                "last_counted": [[w, e] for w, e in self.last_counted.items()],
                "rank_figures": self.rank_figures.state(put), "unseen": list(self.unseen.values())}

    def restore(self, state: Mapping[str, Any], arrays: Sequence[array]) -> None:
        for name, at in state["arrays"].items():
            target = self._arrays()[name]
            del target[:]
            target.extend(arrays[at])
        self.last = {int(w): list(e) for w, e in state["last"]}
        self.last_counted = {int(w): list(e) for w, e in state["last_counted"]}
        self.rank_figures.restore(state.get("rank_figures"), arrays)
        self.unseen = {int(e["rank"]): dict(e) for e in state.get("unseen") or ()}

    def _arrays(self) -> dict[str, array]:
        return {"train_steps": self.train_steps, "val_steps": self.val_steps, "window_steps": self.window_steps,
                "val_loss": self.val_loss, "val_has": self.val_has, "slow_window": self.slow_window,
                "slow_rank": self.slow_rank, "slow_ratio": self.slow_ratio,
                **{f"train.{k}": v for k, v in self.train.items()}, **{f"has.{k}": v for k, v in self.has.items()},
                **{f"window.{k}": v for k, v in self.windows.items()}}


def _median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None
