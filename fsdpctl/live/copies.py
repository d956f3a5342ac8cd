"""The one reader of a run's metrics copies and GPU samples in a process: each line is read and
parsed once, and every consumer (the charts and the report's fold, the exports) is handed the same
whole rows and samples, in the same order.

The metrics copies (every node's ``metrics.jsonl`` and rank telemetry) are read in turn, a chunk of
each at a time, so that no node's rows run far ahead of the others' (a program's own per-rank rows
are merged by step: ``MetricsFeed``). Every file is read to its end at each ``update``. A file longer
than ``SEED_BYTES`` when first seen is, where the reader ``seeds``, sampled for its history instead of
read whole (a page opens at once on a run of days); what it gains from then on is read whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional, Protocol

from ..metrics.gpu_samples import sample_of
from .metrics_feed import MetricsFeed
from .tails import LineTail

CHUNK_BYTES = 64 << 10
"""Of each metrics copy, what is read before the next copy's turn."""
SEED_BYTES = 16 << 20
"""A metrics or samples file longer than this is sampled for its history instead of read whole."""
SAMPLED = 2000


class Consumer(Protocol):
    """What the reader hands on."""

    def row(self, kind: str, row: dict[str, Any]) -> None:
        """A whole row (``train`` or ``val``), in step order within an attempt."""

    def attempt_began(self, from_step: int) -> None:
        """A later attempt resumed from ``from_step``: the rows past it were trained again."""

    def samples(self, samples: list[dict[str, Any]]) -> None:
        """GPU samples (``gpu_samples.sample_of``, with an integer ``node``), in each node's order."""

    # A consumer may also have ``event(row)``: it is then handed the ranks' event rows (``fsdpctl.node.events``).


class CopyReader:
    """A run's copies, read as they grow (``update``), into every consumer ``add`` was given."""

    def __init__(self, files: Callable[[], tuple[list[Path], list[Path]]], world_size: Optional[int] = None,
                 *, seed: bool = True):
        """``files``: the metrics and GPU sample files to read now (asked at each ``update``: copies
        appear as nodes send them); ``seed``: sample a long file's history (see the module)."""
        self.files = files
        self.world_size = world_size
        self.seed = seed
        self.consumers: list[Consumer] = []
        self.problems: list[str] = []
        """What a consumer could not take (said once each): the row goes on to the others, and the
        consumer goes on with the next row."""
        self.reset()

    def reset(self) -> None:
        """Forget everything read (the files are read again from their start)."""
        self.feed = MetricsFeed(self.world_size, on_row=self._row, on_attempt=self._attempt, on_event=self._event)
        self.feed.hold = True  # a program's per-rank rows go out once a round of the copies is read
        self.metric_tails: dict[Path, LineTail] = {}
        self.gpu_tails: dict[Path, LineTail] = {}
        self.sampled = False
        """A file's history was sampled, not read whole: what was made of it stands for it in outline."""

    def add(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def update(self) -> bool:
        """Read what the files gained, to their ends; True when anything came."""
        metrics, gpus = self.files()
        came = False
        tails = []
        for path in metrics:
            tail = self.metric_tails.get(path)
            if tail is None:
                tail = self.metric_tails[path] = LineTail(path)
                came = self._seed(path, tail, lambda lines, path=path: self.feed.add_lines(lines, source=path)) \
                    or came
            tails.append((path, tail))
        while tails:  # each copy in turn, a chunk at a time: no node's rows run far ahead of the others'
            going = []
            for path, tail in tails:
                offset = tail.offset
                came = self.feed.add_lines(tail.read(CHUNK_BYTES), source=path) or came
                if tail.offset > offset and not tail.began_again:
                    going.append((path, tail))  # (a file read again from its start is read on at the next update)
            self.feed.release()
            tails = going
        for path in gpus:
            tail = self.gpu_tails.get(path)
            if tail is None:
                tail = self.gpu_tails[path] = LineTail(path)
                came = self._seed(path, tail, self._sample_lines) or came
            while True:
                offset = tail.offset
                lines = tail.read()
                came = bool(lines) or came
                self._sample_lines(lines)
                if tail.offset == offset or tail.began_again:
                    break
        return came

    def _seed(self, path: Path, tail: LineTail, take: Callable[[list[str]], Any]) -> bool:
        """A file too long to read at once (a run of days): ``SAMPLED`` of its lines, evenly spread
        from its start to its end, stand for its history; what it gains from now on is read whole."""
        if not self.seed:
            return False
        try:
            size = path.stat().st_size
        except OSError:
            return False
        if size <= SEED_BYTES:
            return False
        self.sampled = True
        lines = []
        with path.open("rb") as handle:
            for i in range(SAMPLED):
                handle.seek(size * i // SAMPLED)
                handle.readline()  # the rest of the line the seek cut
                line = handle.readline()
                if line.endswith(b"\n"):
                    lines.append(line.decode("utf-8", "replace"))
            tail.inode, tail.offset = os.fstat(handle.fileno()).st_ino, size
        take(lines)
        return bool(lines)

    def _sample_lines(self, lines: Sequence[str]) -> None:
        samples = [sample for line in lines
                   if (sample := sample_of(line)) is not None and isinstance(sample.get("node"), int)]
        if samples:
            self._each(lambda consumer: consumer.samples(samples))

    def _row(self, kind: str, row: dict[str, Any]) -> None:
        self._each(lambda consumer: consumer.row(kind, row))

    def _attempt(self, from_step: int) -> None:
        self._each(lambda consumer: consumer.attempt_began(from_step))

    def _event(self, row: dict[str, Any]) -> None:
        self._each(lambda consumer: consumer.event(row), only=lambda consumer: hasattr(consumer, "event"))

    def _each(self, give: Callable[[Any], None], only: Callable[[Any], bool] = lambda consumer: True) -> None:
        for consumer in filter(only, self.consumers):
            try:
                give(consumer)
            except Exception as exc:  # noqa: BLE001 - a row a consumer cannot take (a program's own odd row)
                said = f"{type(consumer).__name__} skipped a row it could not take: {type(exc).__name__}: {exc}"
                if said not in self.problems:
                    self.problems.append(said)
