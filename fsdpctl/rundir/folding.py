"""One line for what several ranks say: the same text from several ranks within a short window is shown
once, with the ranks that said it (``[r0-7]``, ``[all 16 ranks]``), as torch's "No Distributed Log Spew"
RFC and Ray's log deduplication do. Only what is shown folds: the nodes' files keep every line.

A group of the same text opens at its first rank's line and takes each other rank's line of that text
while it is open; it is shown once every rank of the world said it, or once its window has passed,
whichever is first, in the order the groups opened (a group still open holds back the ones after
it, for at most the window). A rank that says the text again opens a new group; a rank that says
something else has a group of its own, shown as it was. The clock is the caller's: seconds while
following a run, lines read while reading its files back.

While a run is followed, a rank whose last ``ALONE_BEFORE_AT_ONCE`` lines no other rank said alike
has its lines shown as they come, as Ray's log deduplication shows a line's first instance at once:
rank 0's step lines, which no other rank prints, are not half a second behind the run. Should other
ranks say such a line after all, they are shown on a line of their own once the window has passed,
and the rank's lines wait again until it has said that many alone. A rank's own lines keep their
order: one of its lines still waiting holds the next back.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Optional

from .lines import LogLine

WINDOW_S = 0.5
"""How long a line waits for the other ranks' same line while a run is followed."""
MAX_OPEN = 4096
"""At most this many lines wait at once (the memory a flood of lines may hold here); past it the
oldest is shown without waiting longer."""
ALONE_BEFORE_AT_ONCE = 3
"""How many lines in a row a rank must have said alone before its lines are shown as they come."""
LINES_WINDOW = 2048
"""How many lines read back a line waits for the other ranks' same line (``logs``)."""


class Folded:
    """A line as shown: the first rank's ``line``, and every global rank that said its text."""

    __slots__ = ("line", "ranks", "opened", "many_hosts", "at_once", "joined")

    def __init__(self, line: LogLine, ranks: set[int], opened: float = 0.0):
        self.line, self.ranks, self.opened = line, ranks, opened
        self.many_hosts = False
        self.at_once = False
        """Its first line was shown as it came (``LineFolder``'s lines shown at once)."""
        self.joined: Optional[Folded] = None
        """Of a group whose first line was shown as it came: the other ranks that said it, still to show."""

    def join(self, line: LogLine) -> None:
        """Another rank said the same."""
        self.ranks.add(line.rank)
        if line.host != self.line.host:
            self.many_hosts = True
        if not self.at_once:
            return
        if self.joined is None:
            self.joined = Folded(line, set(), self.opened)
        self.joined.join(line)


def rank_ranges(ranks: list[int]) -> str:
    """``0-3,8,10-11`` for those ranks."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    start = previous = ordered[0]
    for rank in ordered[1:] + [None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ",".join(parts)


def label(folded: Folded, world: Optional[int]) -> str:
    """The prefix's inside: ``host rN`` for one rank, ``host r0-7`` for several on one host, ``r0-3,8-11``
    across hosts, ``all 16 ranks`` for every rank of the world."""
    line = folded.line
    if len(folded.ranks) == 1:
        return f"{line.host} r{line.rank}"
    if world is not None and len(folded.ranks) == world:
        return f"all {world} ranks"
    ranges = f"r{rank_ranges(folded.ranks)}"
    return ranges if folded.many_hosts else f"{line.host} {ranges}"


class LineFolder:
    """Folds the lines of ranks as they come (``add``), giving back what is ready to show."""

    def __init__(self, world: Optional[int] = None, window: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, at_once: Optional[bool] = None):
        self.world, self.window, self.clock = world, window, clock
        self.timed = clock is time.monotonic
        """Whether the window is seconds (a run followed); else lines (``by_lines``)."""
        self.at_once = self.timed if at_once is None else at_once
        """Whether the lines of a rank that keeps saying lines alone are shown as they come (a run followed)."""
        self._waiting_lines: dict[int, int] = {}  # by rank: its lines in the groups still waiting
        self._queue: deque[Folded] = deque()
        self._by_text: dict[str, Folded] = {}
        self._at_once: deque[Folded] = deque()  # shown as they came, open for other ranks to join
        self._joined_at_once = 0  # of those, how many other ranks joined (their line is still to show)
        self._alone: dict[int, int] = {}  # by rank: its groups in a row that closed with it alone

    @classmethod
    def by_lines(cls, world: Optional[int]) -> LineFolder:
        """A folder for lines read back from a run's files: its window is lines read, not seconds (a
        file is read in a moment, whenever its lines were said, and one rank's burst can reach it before
        another's): ``LINES_WINDOW``, or 64 per rank where that is more."""
        return cls(world, window=max(LINES_WINDOW, 64 * (world or 1)), clock=itertools.count().__next__)

    def add(self, line: LogLine, now: Optional[float] = None) -> list[Folded]:
        """Take a rank's line (a line of no rank is shown at once, alone); return what is now ready."""
        now = self.clock() if now is None else now
        if line.rank is None:
            return [*self.ready(now), Folded(line, set(), now)]
        group = self._by_text.get(line.text)
        if group is not None and now - group.opened <= self.window and line.rank not in group.ranks:
            if group.at_once and group.joined is None:
                self._joined_at_once += 1
            group.join(line)
            if not group.at_once:
                self._waiting_lines[line.rank] = self._waiting_lines.get(line.rank, 0) + 1
            return self.ready(now)
        group = self._by_text[line.text] = Folded(line, {line.rank}, now)
        before = self._before_at_once(line.rank)
        if before is not None:
            group.at_once = True
            self._at_once.append(group)
            return [*self.ready(now), *before, group]
        self._queue.append(group)
        self._waiting_lines[line.rank] = self._waiting_lines.get(line.rank, 0) + 1
        return self.ready(now)

    def _before_at_once(self, rank: int) -> Optional[list[Folded]]:
        """None when ``rank``'s new line waits; else it is shown as it came, after the lines of that
        rank still waiting, each alone so far, which are shown now (else a rank saying a line more
        often than the window would have each line wait behind the one before, for ever). A line of
        that rank that others joined keeps the new one waiting behind it."""
        if not self.at_once or self._alone.get(rank, 0) < ALONE_BEFORE_AT_ONCE:
            return None
        if not self._waiting_lines.get(rank):
            return []
        mine = [group for group in self._queue if rank in group.ranks]
        if any(len(group.ranks) > 1 for group in mine):
            return None
        for group in mine:
            self._queue.remove(group)
        return [self._closed(group) for group in mine]

    def add_all(self, lines: list[LogLine]) -> list[Folded]:
        """``add`` each of a batch of lines, the batch taken as one moment (a run followed)."""
        now = self.clock()
        out: list[Folded] = []
        for line in lines:
            out += self.add(line, now if self.timed else None)
        return out

    def ready(self, now: Optional[float] = None) -> list[Folded]:
        """The groups at the front that are complete or whose window has passed (and, past
        ``MAX_OPEN`` waiting, the oldest); of a line shown at once, the ranks that joined it."""
        now = self.clock() if now is None else now
        out = []
        queue, world = self._queue, self.world
        while queue:
            group = queue[0]
            if len(queue) <= MAX_OPEN and now - group.opened <= self.window and (
                    world is None or len(group.ranks) < world):
                break
            out.append(self._close(queue))
        while self._at_once and (len(self._at_once) > MAX_OPEN or now - self._at_once[0].opened > self.window):
            out += self._rest_of(self._close(self._at_once))
        return out

    def waiting(self) -> bool:
        """Whether a line waits for other ranks' same line (or other ranks joined one shown at once)."""
        return bool(self._queue) or self._joined_at_once > 0

    def drain(self) -> list[Folded]:
        """Every group still open, in order (the run ended, or its files were read to the end)."""
        out = [self._close(self._queue) for _ in range(len(self._queue))]
        for _ in range(len(self._at_once)):
            out += self._rest_of(self._close(self._at_once))
        return out

    def _close(self, queue: deque[Folded]) -> Folded:
        return self._closed(queue.popleft())

    def _closed(self, group: Folded) -> Folded:
        """``group``, taken out of its queue: forgotten, and learnt from."""
        if self._by_text.get(group.line.text) is group:
            del self._by_text[group.line.text]
        if not group.at_once:
            for rank in group.ranks:
                left = self._waiting_lines.pop(rank, 1) - 1
                if left:
                    self._waiting_lines[rank] = left
        if self.at_once:
            self._learn(group)
        return group

    def _learn(self, group: Folded) -> None:
        """Count a line its rank said alone; every rank of a line several said starts again from none."""
        if len(group.ranks) == 1:
            self._alone[group.line.rank] = self._alone.get(group.line.rank, 0) + 1
            return
        for rank in group.ranks:
            self._alone[rank] = 0

    def _rest_of(self, group: Folded) -> list[Folded]:
        """Of a group whose first line was shown at once: the ranks that joined it, if any."""
        if group.joined is None:
            return []
        self._joined_at_once -= 1
        return [group.joined]
