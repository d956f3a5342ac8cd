"""Figures of consecutive rows kept in chunks whose count grows with the log of a run's length, so a
resume can drop what came after its step (``fsdpctl.metrics.fold``).

A chunk holds named ``Values`` (``fsdpctl.metrics.quantiles``) of the rows with steps
``begin+1..end``. The newest rows, fewer than ``BATCH``, wait as they came (a row costs an append);
``BATCH`` of them make a chunk, and, as a binary counter carries, two chunks of one size merge into
one twice as large: about log2(N / 16) chunks for N rows. A resume
from a step drops the chunks past it whole and cuts the one chunk it falls in (``Values.cut_to``:
exact while that chunk's values are kept one by one, which holds for chunks of up to
``quantiles.EXACT`` rows, so for resumes that go back that far).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .quantiles import Values, merged_maps

BATCH = 16
"""The newest rows kept as chunks of one, then merged in one pass."""


class Chunk:
    """Rows with steps ``begin+1..end`` (``first``: the first row's step), ``rows`` of them."""

    __slots__ = ("begin", "first", "end", "rows", "figures")

    def __init__(self, begin: int, first: int, end: int, rows: int, figures: dict[str, Values]):
        self.begin, self.first, self.end, self.rows, self.figures = begin, first, end, rows, figures

    @classmethod
    def combined(cls, chunks: Sequence[Chunk]) -> Chunk:
        """Consecutive chunks (oldest first) as one."""
        return cls(chunks[0].begin, chunks[0].first, chunks[-1].end, sum(c.rows for c in chunks),
                   merged_maps([c.figures for c in chunks]))

    def cut_to(self, step: int) -> None:
        share = (step - self.begin) / (self.end - self.begin) if self.end > self.begin else 1.0
        for values in self.figures.values():
            values.cut_to(step, share)
        self.end = step
        self.rows = max(1, round(self.rows * share))


class StepChunks:
    """Rows in (``add``), the named figures of every row kept out (``whole``)."""

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.pending: list[tuple[int, Mapping[str, float]]] = []
        """The newest rows, not yet in a chunk: (step, figures)."""
        self.end = 0
        """The step of the newest row kept (after a resume: the step it resumed from)."""

    def add(self, step: int, figures: Mapping[str, float]) -> None:
        """One row at ``step`` (after the row before it), its figures by name (none: a row counted)."""
        self.pending.append((step, figures))
        self.end = step
        if len(self.pending) >= BATCH:
            chunks = self.chunks
            chunks.append(self._chunk_of(self.pending))
            self.pending = []
            while len(chunks) >= 2 and chunks[-2].rows <= chunks[-1].rows:
                chunks[-2:] = [Chunk.combined(chunks[-2:])]

    def _chunk_of(self, rows: Sequence[tuple[int, Mapping[str, float]]]) -> Chunk:
        before = self.chunks[-1].end if self.chunks else rows[0][0] - 1
        columns: dict[str, tuple[list[int], list[float]]] = {}
        for step, named in rows:
            for name, value in named.items():
                column = columns.get(name)
                if column is None:
                    column = columns[name] = ([], [])
                column[0].append(step)
                column[1].append(value)
        figures = {name: Values.of_steps(steps, values) for name, (steps, values) in columns.items()}
        return Chunk(min(before, rows[0][0] - 1), rows[0][0], rows[-1][0], len(rows), figures)

    def truncate(self, step: int) -> None:
        """A later attempt resumed from ``step``: forget the rows past it."""
        self.pending = [row for row in self.pending if row[0] <= step]
        if not self.pending:
            while self.chunks and self.chunks[-1].first > step:
                self.chunks.pop()
            if self.chunks and self.chunks[-1].end > step:
                self.chunks[-1].cut_to(step)
        self.end = min(self.end, step)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks) + len(self.pending)

    def whole(self) -> dict[str, Values]:
        """Every figure over all the rows kept."""
        parts = [c.figures for c in self.chunks]
        if self.pending:
            parts.append(self._chunk_of(self.pending).figures)
        return merged_maps(parts) if parts else {}

    # ---- kept in the chart index -----------------------------------------------------------------
    def state(self, put: Callable[[array], int]) -> dict[str, Any]:
        return {"chunks": [[c.begin, c.first, c.end, c.rows, {name: v.state(put) for name, v in c.figures.items()}]
                           for c in self.chunks],
                "pending": [[step, dict(figures)] for step, figures in self.pending], "end": self.end}

    def restore(self, state: Mapping[str, Any], arrays: Sequence[array]) -> None:
        self.chunks = [Chunk(int(begin), int(first), int(end), int(rows),
                             {str(name): Values.of_state(v, arrays) for name, v in figures.items()})
                       for begin, first, end, rows, figures in state["chunks"]]
        self.pending = [(int(step), {str(k): float(v) for k, v in figures.items()})
                        for step, figures in state["pending"]]
        self.end = int(state["end"])
