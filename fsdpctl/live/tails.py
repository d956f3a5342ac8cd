"""Reading what a run's files gained since the last look, and nothing else: each snapshot costs the
new bytes only, however long the run has been going (a day's metrics are hundreds of MB at 128 ranks).

``LineTail`` gives a file's new complete lines, a bounded amount per call, and says when the file was
replaced or cut shorter (its reader starts over). ``MergedLogTail`` gives a run's newest log lines
from the launcher's ``logs/merged.log``; a backend whose nodes write elsewhere gives its own (``LogTail``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Optional, Protocol

from ..rundir.lines import LogLine, parse_shown

READ_LIMIT = 8 << 20
"""Bytes one call reads of one file at most (a reader far behind catches up over several snapshots)."""


class LineTail:
    """A file's complete lines as it grows (a line still being written waits for its newline)."""

    def __init__(self, path: Path, start_back: Optional[int] = None):
        """``start_back``: begin that many bytes before the file's end (its first, likely cut, line
        skipped) instead of at its start."""
        self.path = path
        self.start_back = start_back
        self.inode: Optional[int] = None
        self.offset = 0
        self.partial = b""
        self.began_again = False
        """The last ``read`` found the file replaced or cut shorter, and read it from its start."""

    def size(self) -> int:
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    def pending(self) -> bool:
        """Whether there is something new to read (one stat; no read)."""
        try:
            stat = self.path.stat()
        except OSError:
            return False
        return stat.st_ino != self.inode or stat.st_size != self.offset

    def read(self, limit: int = READ_LIMIT) -> list[str]:
        """The lines completed since the last call (at most ``limit`` bytes read)."""
        self.began_again = False
        try:
            handle = self.path.open("rb")
        except OSError:
            return []
        with handle:
            stat = os.fstat(handle.fileno())
            skip_first = False
            if stat.st_ino != self.inode or stat.st_size < self.offset:
                self.began_again = self.inode is not None
                self.inode, self.offset, self.partial = stat.st_ino, 0, b""
                if self.start_back is not None and stat.st_size > self.start_back and not self.began_again:
                    self.offset, skip_first = stat.st_size - self.start_back, True
            handle.seek(self.offset)
            data = handle.read(limit)
        self.offset += len(data)
        data = self.partial + data
        end = data.rfind(b"\n")
        if end < 0:
            self.partial = data
            return []
        self.partial = data[end + 1:]
        lines = data[:end].decode("utf-8", "replace").split("\n")
        return lines[1:] if skip_first else lines


class LogTail(Protocol):
    """A run's newest log lines as they come (what ``Backend.log_tail`` gives)."""

    def pending(self) -> bool:
        """Something new may be there (cheap: no read)."""

    def read_new(self) -> list[LogLine]:
        """The lines that came since the last call (at first: the newest few hundred KB's)."""


START_BACK = 256 << 10
"""Of a long log, what a new viewer reads first (its newest lines)."""


class MergedLogTail:
    """The launcher's ``merged.log`` (every line as shown, ``[host rR] text``), followed."""

    def __init__(self, path: Path, node_of: Mapping[str, int] | Callable[[str], int]):
        self.tail = LineTail(path, start_back=START_BACK)
        self.node_of = node_of if callable(node_of) else (lambda host: node_of.get(host, 0))

    def pending(self) -> bool:
        return self.tail.pending()

    def read_new(self) -> list[LogLine]:
        return [line for text in self.tail.read() if (line := parse_shown(text, self.node_of)) is not None]
