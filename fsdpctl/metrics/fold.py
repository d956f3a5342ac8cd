"""A run's report figures folded row by row, so ``fsdpctl report`` of a run of any length reads a few
MB (the run's chart index keeps a fold: ``fsdpctl.live.chart_index``) instead of its GBs of metrics.

What a summary needs of each row is kept as it comes: the training rows' loss, tokens/s, MFU and
step time, the validation losses, and of each window of per-rank timings what the straggler rules
judge in it (the compute rule's slow ranks and by how much, the wait rule's culprit and by how much,
the spreads and gaps the "ranks even" lines take medians of, the step's wall time), plus the newest
window's entries. Each figure's values are kept as ``fsdpctl.metrics.quantiles.Values``: one by one
while a run is short (its medians exact), then as a quantile sketch whose medians are within
``quantiles.ERROR`` (0.2 %) of the exact ones, so the fold of a run of a million steps is about the
size of one of ten thousand. Each rank's figures over the run are sums kept per rank
(``fsdpctl.metrics.rank_figures``). ``summarize`` of a read ``Series`` is made by the same code, so a
report from the fold and one from the files say the same.

A later attempt that resumes from a step drops what the fold kept past it (``truncate``), as the
reader of the files drops those rows: exactly while that far back is kept one by one
(``fsdpctl.metrics.step_chunks``).
"""

from __future__ import annotations

import statistics
from array import array
from collections.abc import Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, Optional

from ..node.events import EVENT, STEPS_UNSEEN
from ..workload.straggler import Tally, even_text_from, slow_ranks, spread_of
from .quantiles import Values
from .rank_figures import RankFigures
from .step_chunks import StepChunks
from .wait_rule import timed_from_outside, wait_even_from, wait_gap, wait_verdict_from, window_culprit

TRAIN = ("loss", "tokens_per_s", "mfu", "step_time_s", "val_loss")
ONE_RANK_TEXT = "a single rank, with no other rank to compare its timings with"
KEPT = ("rank", "node", "host", "local_rank", "wall_s", "mem_mb", "timing", "comm", "compute_s", "comm_s", "data_s",
        "untimed_ops")
"""Of the newest window's entries, what a verdict names or a summary shows."""


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
        self.train = StepChunks()
        """The training rows' figures (``TRAIN``, where a row has them)."""
        self.val = StepChunks()
        """The validation rows' ``val_loss``."""
        self.windows: dict[int, StepChunks] = {}
        """Width (ranks in a window) -> its windows' figures: ``seen`` and ``counted`` (one each, the
        compute rule counting it), ``wall``, ``spread``, ``gap``, ``flag R CAUSE`` (the wait rule's
        culprit at position R: by how much) and ``slow R`` (the compute rule's: its ratio)."""
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
            self.val.add(step, _present_figures(row, ("val_loss",)))
            return
        last_window = max((c.end for c in self.windows.values()), default=0)
        self.train.add(step, _present_figures(row, TRAIN))
        ranks = row.get("ranks")
        if isinstance(ranks, list) and ranks:
            steps = row.get("steps")
            if not isinstance(steps, int) or steps < 1:  # no "steps" (the workload's rows): since the window before
                steps = step - last_window
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
        figures: dict[str, float] = {"seen": 0.0}
        if counted:
            figures["counted"] = 0.0
            for rank, ratio in slow_ranks([float(e["compute_s"]) for e in entries]).items():
                figures[f"slow {rank}"] = ratio
        if walls and len(walls) == width:
            figures["wall"] = statistics.median(walls)
        if spread is not None:
            figures["spread"] = spread
        if gap is not None:
            figures["gap"] = gap
        if culprit is not None:
            figures[f"flag {culprit[0]} {culprit[1]}"] = culprit[2]
        self.windows.setdefault(width, StepChunks()).add(step, figures)
        kept = [{k: e[k] for k in KEPT if k in e} for e in entries]
        self.last[width] = kept
        if counted:
            self.last_counted[width] = kept

    def truncate(self, step: int) -> None:
        """A later attempt resumed from ``step``: forget the rows past it (the failed attempt's)."""
        for chunks in (self.train, self.val, *self.windows.values()):
            chunks.truncate(step)
        self.rank_figures.truncate(step)

    # ---- a summary out ---------------------------------------------------------------------------
    @property
    def world(self) -> int:
        """Ranks in the widest window (the windows the summary judges: every rank in them)."""
        return max((w for w, chunks in self.windows.items() if chunks.rows), default=0)

    def figures(self, workload_summary: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
        """The run's figures, as ``RunSummary`` has them (``fsdpctl.metrics.summary.summary_of``);
        ``workload_summary``: the bundled workload's summary.json, for what the rows leave out."""
        out = SimpleNamespace(steps=None, final_loss=None, best_loss=None, best_loss_step=None, final_val_loss=None,
                              best_val_loss=None, memory_mb_per_rank=[])
        train = self.train.whole()
        loss = train.get("loss")
        if loss is not None and loss.newest_step is not None:
            out.steps, out.final_loss = loss.newest_step, loss.newest
            out.best_loss, out.best_loss_step = loss.low, loss.low_step
        val = (self.val.whole() if self.val.rows else train).get("val_loss")
        if val is not None and val.newest_step is not None:
            out.final_val_loss, out.best_val_loss = val.newest, val.low
        out.tokens_per_s = _median(train.get("tokens_per_s"))
        out.mfu = _median(train.get("mfu"))
        world = self.world
        judged = self.windows[world].whole() if world else {}
        out.step_time_s = _median(train.get("step_time_s")) or _median(judged.get("wall"))
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

    def _verdict(self, judged: Mapping[str, Values], last: list[dict[str, Any]],
                 world: int) -> tuple[Optional[dict[str, Any]], Optional[str]]:
        """The straggler rule the windows call for, over the judged windows; and its "ranks even" line."""
        nothing = Values()
        if timed_from_outside([last]):
            seen = len(judged["seen"]) if world >= 2 else 0
            flagged: dict[int, dict[str, Values]] = {}
            for name, values in judged.items():
                if name.startswith("flag "):
                    _, position, cause = name.split(" ")
                    flagged.setdefault(int(position), {})[cause] = values
            where = dict(enumerate(last)) if world >= 2 else {}
            return wait_verdict_from(seen, flagged, where), wait_even_from(last, judged.get("gap", nothing))
        tally = Tally()
        tally.seen = len(judged.get("counted", nothing))
        if tally.seen:
            tally.slow = {int(name.split(" ")[1]): values for name, values in judged.items()
                          if name.startswith("slow ")}
            tally.where = dict(enumerate(self.last_counted.get(world, [])))
        return tally.verdict(), even_text_from(judged.get("spread", nothing))

    # ---- kept in the chart index -----------------------------------------------------------------
    def state(self, put: Callable[[array], int]) -> dict[str, Any]:
        """Plain data, its arrays handed to ``put`` (which says where they are kept)."""
        return {"train": self.train.state(put), "val": self.val.state(put),
                "windows": [[w, chunks.state(put)] for w, chunks in self.windows.items()],
                "last": [[w, e] for w, e in self.last.items()],
                "last_counted": [[w, e] for w, e in self.last_counted.items()],
                "rank_figures": self.rank_figures.state(put), "unseen": list(self.unseen.values())}

    def restore(self, state: Mapping[str, Any], arrays: Sequence[array]) -> None:
        self.train.restore(state["train"], arrays)
        self.val.restore(state["val"], arrays)
        self.windows = {}
        for width, chunks in state["windows"]:
            self.windows[int(width)] = StepChunks()
            self.windows[int(width)].restore(chunks, arrays)
        self.last = {int(w): list(e) for w, e in state["last"]}
        self.last_counted = {int(w): list(e) for w, e in state["last_counted"]}
        self.rank_figures.restore(state.get("rank_figures"), arrays)
        self.unseen = {int(e["rank"]): dict(e) for e in state.get("unseen") or ()}


def _present_figures(row: Mapping[str, Any], keys: Sequence[str]) -> dict[str, float]:
    """A row's figures as the reader of the files takes them (``Series.column``): numbers only, a
    loss that went NaN kept as such."""
    return {key: float(value) for key in keys if isinstance(value := row.get(key), (int, float))}


def _median(values: Optional[Values]) -> Optional[float]:
    return values.median() if values else None
