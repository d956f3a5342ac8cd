"""A run's output, from the bytes a node logs to the lines the launcher, ``logs`` and the API show.

A node's log holds whatever its ranks printed, byte for byte; it is copied as it is. What is shown
is one line per newline, made readable: torchrun's ``[rank<N>]:`` prefix (the template fsdpctl gives
it in ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``) becomes the line's ``rank``; invalid UTF-8 shows as
replacement characters; a NUL shows as ``\\0`` instead of ending the text; a line of ``\\r``
progress updates (tqdm) shows its last state, as a terminal would; and a line longer than
``MAX_LINE_BYTES`` shows its first ``HEAD_BYTES`` and last ``TAIL_BYTES`` with a mark saying how
many bytes were cut and where the whole line is. Memory per node stays bounded by these sizes,
whatever a rank prints.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Optional

if TYPE_CHECKING:
    from ..plan.types import LaunchPlan

RANK_PREFIX = "[rank"
MAX_LINE_BYTES = 16 * 1024
"""Lines up to this size are shown whole."""
HEAD_BYTES = 12 * 1024
TAIL_BYTES = 2 * 1024
_EMBEDDED = re.compile(rb"\[rank\d+\]:")
_RANKS_TEXT = r"fsdpctl: global (?:rank (\d+)|ranks (\d+-\d+)) on node "
"""Local rank 0's line naming its node's global ranks (``fsdpctl.node.startup.sitecustomize``): ``rank 3``
for a node of one rank, ``ranks 8-15`` (``ranks 3-3`` in the logs of runs before that)."""
_RANKS = re.compile(_RANKS_TEXT)
_RANKS_IN_LOG = re.compile(rb"\[rank\d+\]:" + _RANKS_TEXT.encode())
RANKS_HEAD_BYTES = 256 * 1024
STEP_LINE = re.compile(r"\bstep=(\d+) loss=")
"""The bundled workload's training step line (``step=N loss=...``); group 1 is the step."""
"""Of a node's log, what is read for that line: a rank says it before its program starts."""


def _span(one: Optional[str], several: Optional[str]) -> str:
    """``3`` for one rank (said as ``rank 3``, or as ``ranks 3-3`` by older runs), else ``8-15``."""
    if several is None:
        return str(one)
    first, last = several.split("-")
    return first if first == last else several


def ranks_said(line: LogLine) -> Optional[str]:
    """``0-7`` (``3`` for one) when ``line`` is local rank 0's naming of its node's global ranks, else None."""
    match = _RANKS.match(line.text) if line.rank is not None else None
    return _span(*match.groups()) if match else None


def ranks_in_log(path: Path) -> Optional[str]:
    """The global ranks a node's log (as a node writes it) says the node holds; None: not said yet."""
    try:
        with path.open("rb") as handle:
            match = _RANKS_IN_LOG.search(handle.read(RANKS_HEAD_BYTES))
    except OSError:
        return None
    return _span(*(None if said is None else said.decode() for said in match.groups())) if match else None


class LogLine(NamedTuple):
    """A line of a run: ``text`` as the rank (or the node) printed it, shown readable; ``rank`` the
    global rank that printed it (None for the node's own lines: its script's, torchrun's)."""

    node_rank: int
    host: str
    text: str
    rank: Optional[int] = None
    cut: int = 0
    """Bytes of a long line that are not shown (the whole line is in the node's log)."""

    @classmethod
    def of(cls, node_rank: int, host: str, stored: str) -> LogLine:
        """A line as logs keep it (``[rank<N>]:text``, or the node's own text)."""
        if stored.startswith(RANK_PREFIX):
            close = stored.find("]:", 5, 16)
            if close > 5 and stored[5:close].isdigit():
                return cls(node_rank, host, stored[close + 2:], int(stored[5:close]))
        return cls(node_rank, host, stored)

    def stored(self) -> str:
        """The line as logs keep it: torchrun's prefix and the text."""
        return self.text if self.rank is None else f"[rank{self.rank}]:{self.text}"

    def __str__(self) -> str:
        return f"[{self.host} r{self.rank}] {self.text}" if self.rank is not None else f"[{self.host}] {self.text}"


def _split_prefix(raw: bytes) -> tuple[Optional[int], bytes]:
    if raw.startswith(b"[rank"):
        close = raw.find(b"]:", 5, 16)
        if close > 5 and raw[5:close].isdigit():
            return int(raw[5:close]), raw[close + 2:]
    return None, raw


def _show(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace")
    return text.replace("\0", "\\0") if "\0" in text else text


def last_state(raw: bytes) -> bytes:
    """What a terminal shows of a line of ``\\r`` updates: the text after the last one."""
    raw = raw.rstrip(b"\r")
    at = raw.rfind(b"\r")
    return raw if at < 0 else raw[at + 1:]


class LineSplitter:
    """One node's log bytes, as they arrive in chunks of any size, into lines to show. ``where``
    names the whole log in the mark on a cut line."""

    def __init__(self, node_rank: int, host: str, where: str):
        self.node_rank, self.host, self.where = node_rank, host, where
        self.partial = b""
        self.tail = b""  # of a line being cut: its last bytes so far
        self.length = 0  # of a line being cut: its bytes so far
        self.cutting = False
        self.unfinished: dict[int, bytes] = {}  # per rank: the start of a line torchrun echoed unfinished

    def _line(self, raw: bytes) -> LogLine:
        rank, raw = _split_prefix(raw)
        if rank is not None and rank in self.unfinished:  # the start of this rank's line came earlier
            raw = self.unfinished.pop(rank) + raw
        if b"\r" in raw:
            raw = last_state(raw)
        return LogLine(self.node_rank, self.host, _show(raw), rank)

    def _long(self, head: bytes, tail: bytes, length: int) -> LogLine:
        whole_head = len(head)
        rank, head = _split_prefix(head)
        if b"\r" in tail.rstrip(b"\r"):  # progress updates: their last state is all a terminal shows
            return LogLine(self.node_rank, self.host, _show(last_state(tail)), rank)
        cut = length - whole_head - len(tail)
        printed = length - (whole_head - len(head))  # what the rank printed: without torchrun's prefix
        text = (f"{_show(head)} [... fsdpctl: {cut} bytes of this {printed}-byte line cut; the whole line is in "
                f"{self.where}] {_show(tail)}")
        return LogLine(self.node_rank, self.host, text, rank, cut)

    def _start_cut(self) -> None:
        self.cutting, self.length = True, len(self.partial)
        self.tail = self.partial[-TAIL_BYTES:]
        self.partial = self.partial[:HEAD_BYTES]

    def _grow(self, data: bytes) -> None:
        self.length += len(data)
        self.tail = (self.tail + data)[-TAIL_BYTES:]

    def _finish(self) -> LogLine:
        line = self._long(self.partial, self.tail, self.length)
        self.partial, self.tail, self.length, self.cutting = b"", b"", 0, False
        return line

    def feed(self, chunk: bytes) -> list[LogLine]:
        """The lines that ``chunk`` completes."""
        out: list[LogLine] = []
        start = 0
        if self.cutting or self.partial:
            newline = chunk.find(b"\n")
            if newline < 0:
                if self.cutting:
                    self._grow(chunk)
                else:
                    self.partial += chunk
                    if len(self.partial) > MAX_LINE_BYTES:
                        self._start_cut()
                return out
            if self.cutting:
                self._grow(chunk[:newline])
                out.append(self._finish())
            else:
                out += self._whole(self.partial + chunk[:newline])
                self.partial = b""
            start = newline + 1
        last = chunk.rfind(b"\n")
        if last >= start:
            body = chunk[start:last]
            if b"\r" in body or b"\0" in body or self.unfinished or \
                    body.count(b"[rank") != body.count(b"\n[rank") + body.startswith(b"[rank"):
                for raw in body.split(b"\n"):
                    out += self._whole(raw)
            else:
                out += self._plain(body.split(b"\n"))
            start = last + 1
        if start < len(chunk):
            self.partial = chunk[start:]
            if len(self.partial) > MAX_LINE_BYTES:
                self._start_cut()
        return out

    def _plain(self, raws: list[bytes]) -> list[LogLine]:
        """Lines without \\r, NUL or a second rank prefix: the common case, and the launcher's
        per-line cost in a flood (the prefix of the line before is tried first)."""
        node, host, out = self.node_rank, self.host, []
        prefix, rank, skip = b"\0", None, 0
        for raw in raws:
            if len(raw) > MAX_LINE_BYTES:
                out += self._whole(raw)
            elif raw.startswith(prefix):
                out.append(LogLine(node, host, raw[skip:].decode("utf-8", "replace"), rank))
            elif raw[:5] == b"[rank" and (close := raw.find(b"]:", 5, 16)) > 5 and raw[5:close].isdigit():
                prefix, rank, skip = raw[:close + 2], int(raw[5:close]), close + 2
                out.append(LogLine(node, host, raw[skip:].decode("utf-8", "replace"), rank))
            else:
                out.append(LogLine(node, host, raw.decode("utf-8", "replace")))
        return out

    def _interleaved(self, raw: bytes) -> list[LogLine]:
        """torchrun echoes a rank's unfinished line (a progress bar without its newline yet, or what a
        rank's buffer flushed mid-line) as it is, and the next echo lands after it on the same line:
        ``[rank0]:loss=1.2[rank1]:step=...``. Each piece but the last is an unfinished line of its
        rank, kept until that rank's next piece completes it."""
        starts = [m.start() for m in _EMBEDDED.finditer(raw)]
        out = []
        for a, b in zip(starts, [*starts[1:], len(raw)], strict=True):
            if b == len(raw):
                out.append(self._line(raw[a:b]))
                continue
            rank, piece = _split_prefix(raw[a:b])
            if rank is not None:
                self.unfinished[rank] = self.unfinished.get(rank, b"") + piece
        return out

    def _whole(self, raw: bytes) -> list[LogLine]:
        """Any complete line (the common one has a fast path in ``feed``)."""
        if len(raw) > MAX_LINE_BYTES:
            return [self._long(raw[:HEAD_BYTES], raw[-TAIL_BYTES:], len(raw))]
        if raw.find(b"[rank", 1) > 0 and _EMBEDDED.match(raw):
            return self._interleaved(raw)
        return [self._line(raw)]

    def end(self) -> list[LogLine]:
        """The last line, when the log ended without a newline."""
        if self.cutting:
            return [self._finish()]
        if self.partial:
            lines, self.partial = self._whole(self.partial), b""
            return lines
        return []


def shown(lines: list[LogLine]) -> str:
    """Lines as a run's ``merged.log`` keeps them: as they are shown (``[host rR] text`` for rank R's,
    ``[host] text`` for the node's own), one per line. The one writer of the format."""
    return "".join([f"{line}\n" for line in lines])


_SHOWN = re.compile(r"^\[(?P<host>\S+?)(?: r(?P<rank>\d+))?\] (?P<text>.*)$")


def parse_shown(text: str, node_of: Callable[[str], int]) -> Optional[LogLine]:
    """A line of ``merged.log`` (``shown``'s format) back as a LogLine, its node rank from its host
    (None: not such a line)."""
    match = _SHOWN.match(text)
    if match is None:
        return None
    rank = int(match["rank"]) if match["rank"] is not None else None
    return LogLine(node_of(match["host"]), match["host"], match["text"], rank)
_BEFORE_0_2 = re.compile(r"^\[(?P<host>\S+) r(?P<node>\d+)\] (?P<text>.*)$")
"""merged.log as fsdpctl 0.1 wrote it: ``[host rN]`` with N the node rank, then the line as stored."""
_OLD_RANK_LINE = re.compile(r"^\[\S+ r\d+\] \[rank\d+\]:")


def _written_before_0_2(path: Path) -> bool:
    """A merged.log of fsdpctl 0.1 that was not written again since (``fsdpctl logs`` rewrites it when
    it completes it from the nodes): its ranks' lines say ``[rankR]:`` after the prefix."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        return any(_OLD_RANK_LINE.match(line) for line in handle)


def read_merged(path: Path, plan: LaunchPlan, sink: Callable[[LogLine], None]) -> int:
    """Every line of a ``merged.log`` (``shown``'s format; older versions' too) back as LogLines, the
    node rank from the host's place in ``plan``; returns how many."""
    if not path.exists():
        return 0
    node_of = {node.host: node.node_rank for node in plan.nodes}
    old = plan.fsdpctl_version.split(".")[:2] in (["0", "0"], ["0", "1"]) and _written_before_0_2(path)
    count = 0
    with path.open(encoding="utf-8", errors="replace") as handle:
        for raw in handle:
            text = raw.rstrip("\n")
            if old:
                if match := _BEFORE_0_2.match(text):
                    sink(LogLine.of(int(match["node"]), match["host"], match["text"]))
                    count += 1
            elif (line := parse_shown(text, lambda host: node_of.get(host, 0))) is not None:
                sink(line)
                count += 1
    return count
