"""``Run.logs``'s lines: read on a thread of their own, handed over through a bounded queue."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from ..rundir.lines import LogLine


class LogLines:
    """A run's lines, read (or followed) as they are iterated; ``notes`` says afterwards what could
    not be read. Lines wait in a bounded queue: a slow reader slows the reading, never memory."""

    QUEUE_LINES = 4096

    def __init__(self, produce: Callable[[Callable[[LogLine], None], threading.Event], list[str]],
                 keep: Callable[[LogLine], bool]):
        self._produce, self._keep = produce, keep
        self.notes: list[str] = []

    def __iter__(self) -> Iterator[LogLine]:
        lines: queue.Queue = queue.Queue(maxsize=self.QUEUE_LINES)
        leave = threading.Event()
        done = object()
        failed: list[BaseException] = []

        def put(item: object) -> None:
            while not leave.is_set():
                try:
                    lines.put(item, timeout=0.2)
                    return
                except queue.Full:
                    continue

        def sink(line: LogLine) -> None:
            if self._keep(line):
                put(line)

        def body() -> None:
            try:
                self.notes.extend(self._produce(sink, leave))
            except BaseException as exc:  # noqa: BLE001 - handed to the reader, raised there
                failed.append(exc)
            finally:
                put(done)

        reader = threading.Thread(target=body, name="fsdpctl-logs", daemon=True)
        reader.start()
        try:
            while (item := lines.get()) is not done:
                yield item
            if failed:
                raise failed[0]
        finally:
            leave.set()
            reader.join(timeout=30)
