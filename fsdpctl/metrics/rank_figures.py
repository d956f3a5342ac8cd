"""Each rank's figures over a run, kept window by window in bounded memory: what ``fsdpctl report``'s
per-rank table shows (``fsdpctl.metrics.rank_table``).

Per rank: compute, collective wait and data wait per step, as step-weighted means over the run's
windows (a window counts for the steps it covers); its peak memory (the largest of its windows'); and
the collectives per step that the start-up hook could not time (``untimed_ops``: inside compiled code),
a window without the figure counting as none. Means rather than medians: a mean needs a sum and a
weight per rank, a median every window of every rank (a 128-rank run of 100,000 windows: 100 MB).

The sums are kept in chunks of consecutive windows: the newest ``BATCH`` windows one by one, then
chunks whose sizes halve from the oldest to the newest (two of one size merge, as a binary counter
carries): about 16 + log2(W / 16) chunks for W windows. A later attempt that resumes from a step
(``truncate``) drops the chunks past it whole; the one chunk it cuts into keeps its means, its weight
cut to the share of its steps kept (exact where that chunk's figures were steady), and its peak
memory. Windows of each width (ranks in them) are kept apart, as the fold judges the widest.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

MEANS = ("compute_s", "comm_s", "data_s", "untimed_ops")
"""The figures kept as step-weighted means, in this order in a chunk's arrays."""
ABSENT_IS_ZERO = ("untimed_ops",)
"""Figures a window without them had none of (the hook writes ``untimed_ops`` only when some ran)."""
NUMBERS = (int, float)
"""The types a figure has (as the fold reads a row's figures)."""
NO_PEAK = float("-inf")
"""A peak memory not known (below any figure, so peaks merge by ``max``)."""
BATCH = 16
"""The newest windows kept one by one, then added up in one pass (rather than a pass per pair of them);
a resume that goes back no further than them drops windows whole."""


class _Chunk:
    """Consecutive windows of one width: steps ``begin+1..end``; per figure and position (a rank), the
    sum of value x steps and the steps it had the figure for (``MEANS`` in turn, each a position
    after another); each position's peak memory."""

    __slots__ = ("begin", "first", "end", "windows", "sums", "weights", "peaks")

    def __init__(self, begin: int, first: int, end: int, windows: int, sums: array, weights: array, peaks: array):
        self.begin, self.first, self.end, self.windows = begin, first, end, windows
        self.sums, self.weights, self.peaks = sums, weights, peaks

    @classmethod
    def of_window(cls, step: int, steps: int, entries: Sequence[Mapping[str, Any]]) -> _Chunk:
        weight, width = float(steps), len(entries)
        sums, weights = array("d"), array("d")
        for key in MEANS:  # a figure's positions side by side
            column = [e.get(key, 0.0) for e in entries] if key in ABSENT_IS_ZERO else [e.get(key) for e in entries]
            try:  # the usual window: every rank has the figure
                sums.extend([v * weight for v in column])
                weights.extend(array("d", [weight]) * width)
            except TypeError:  # a rank without it (None), or not a number
                missing = weight if key in ABSENT_IS_ZERO else 0.0
                sums.extend([v * weight if isinstance(v, NUMBERS) else 0.0 for v in column])
                weights.extend([weight if isinstance(v, NUMBERS) else missing for v in column])
        peaks = array("d", [v if isinstance(v, NUMBERS) else NO_PEAK for v in (e.get("mem_mb") for e in entries)])
        return cls(step - steps, step, step, 1, sums, weights, peaks)

    @classmethod
    def combined(cls, chunks: Sequence[_Chunk]) -> _Chunk:
        """Consecutive chunks (oldest first) as one."""
        first, last = chunks[0], chunks[-1]
        return cls(first.begin, first.first, last.end, sum(c.windows for c in chunks),
                   array("d", [sum(v) for v in zip(*(c.sums for c in chunks), strict=True)]),
                   array("d", [sum(v) for v in zip(*(c.weights for c in chunks), strict=True)]),
                   array("d", [max(v) for v in zip(*(c.peaks for c in chunks), strict=True)]))

    def cut_to(self, step: int) -> None:
        """Keep steps up to ``step`` (at least its first window's), the means as they were."""
        share = (step - self.begin) / (self.end - self.begin) if self.end > self.begin else 1.0
        self.sums = array("d", (v * share for v in self.sums))
        self.weights = array("d", (v * share for v in self.weights))
        self.end = step


class RankFigures:
    """Windows in (``add``), each rank's figures over them out (``figures``)."""

    def __init__(self) -> None:
        self.chunks: dict[int, list[_Chunk]] = {}
        """Width -> its chunks, oldest first."""
        self.known = True
        """False once restored from a chart index written before per-rank figures were kept: the rows
        before it are not in them, so there are none to show."""

    def add(self, step: int, steps: int, entries: Sequence[Mapping[str, Any]]) -> None:
        """One window ending at ``step`` and covering ``steps`` steps: an entry per rank, in rank order."""
        chunks = self.chunks.setdefault(len(entries), [])
        chunks.append(_Chunk.of_window(step, max(1, steps), entries))
        if len(chunks) >= BATCH and chunks[-BATCH].windows == 1:  # (sizes never grow: the newest BATCH are single)
            chunks[-BATCH:] = [_Chunk.combined(chunks[-BATCH:])]
            while len(chunks) >= 2 and chunks[-2].windows <= chunks[-1].windows:
                chunks[-2:] = [_Chunk.combined(chunks[-2:])]

    def truncate(self, step: int) -> None:
        """A later attempt resumed from ``step``: forget the windows past it."""
        for chunks in self.chunks.values():
            while chunks and chunks[-1].first > step:
                chunks.pop()
            if chunks and chunks[-1].end > step:
                chunks[-1].cut_to(step)

    def figures(self, width: int) -> list[dict[str, Optional[float]]]:
        """Per position in the windows ``width`` wide: its means (None: no window had the figure;
        ``untimed_ops`` None where no rank had any) and ``mem_mb``, its peak memory."""
        chunks = self.chunks.get(width) or []
        if not self.known or not chunks:
            return []
        count = len(MEANS)
        whole = _Chunk.combined(chunks)
        sums, weights, peaks = whole.sums, whole.weights, whole.peaks
        untimed = MEANS.index("untimed_ops") * width
        any_untimed = any(value > 0 for value in sums[untimed:untimed + width])
        out = []
        for position in range(width):
            at = [i * width + position for i in range(count)]
            means = {key: round(sums[at[i]] / weights[at[i]], 2 if key == "untimed_ops" else 6)
                     if weights[at[i]] > 0 else None for i, key in enumerate(MEANS)}
            if not any_untimed:
                means["untimed_ops"] = None
            out.append({**means, "mem_mb": None if peaks[position] == NO_PEAK else peaks[position]})
        return out

    # ---- kept in the chart index -----------------------------------------------------------------
    def state(self, put: Callable[[array], int]) -> dict[str, Any]:
        """Plain data, its arrays handed to ``put``: per width, each chunk's steps and windows, and
        its figures end to end."""
        widths = []
        for width, chunks in self.chunks.items():
            steps = array("q", (v for c in chunks for v in (c.begin, c.first, c.end, c.windows)))
            sums, weights, peaks = array("d"), array("d"), array("d")
            for chunk in chunks:
                sums.extend(chunk.sums)
                weights.extend(chunk.weights)
                peaks.extend(chunk.peaks)
            widths.append([width, put(steps), put(sums), put(weights), put(peaks)])
        return {"known": self.known, "widths": widths}

    def restore(self, state: Optional[Mapping[str, Any]], arrays: Sequence[array]) -> None:
        """Back to ``state``; None (an index written before these figures were kept): none known."""
        self.chunks = {}
        if state is None:
            self.known = False
            return
        self.known = bool(state["known"])
        count = len(MEANS)
        for width, steps_at, sums_at, weights_at, peaks_at in state["widths"]:
            width, steps = int(width), arrays[steps_at]
            sums, weights, peaks = arrays[sums_at], arrays[weights_at], arrays[peaks_at]
            chunks = self.chunks[width] = []
            for c in range(len(steps) // 4):
                figures, places = slice(c * width * count, (c + 1) * width * count), slice(c * width, (c + 1) * width)
                # (slices are copies: an array of the index may be shared by several names)
                chunks.append(_Chunk(*(int(v) for v in steps[c * 4:c * 4 + 4]), sums[figures], weights[figures],
                                     peaks[places]))
