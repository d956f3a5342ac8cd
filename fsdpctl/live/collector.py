"""The one collector of a run: the process that follows it (the launcher of a foreground run, a
detached run's follower) keeps here a copy of what each node's side files gain (``live/node<R>/``),
and says every second how the nodes stand (``live/follower.json``). Viewers read only these: however
many there are, the nodes are asked nothing more.

Copies of JSON-lines files only grow: a node file that begins again (the next attempt rewrites
``metrics.jsonl``, a spare's file is another file) is appended after a line break, and readers take
the newest row of a step (and drop a failed attempt's rows past the step the next one resumed from:
the ``attempt`` line written here when an attempt begins says which). ``summary.json`` is written
whole. How far each copy goes (the node file's inode and offset) is kept in ``live/collect.json``, so
the agent of a later attempt on the same host sends only what is new.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Protocol

from ..metrics.rows import ATTEMPT_MARK
from ..rundir.paths import private_dir, read_json, write_json_atomic
from ..rundir.state import Outcome
from . import layout
from .chart_index import INDEX_SECONDS
from .copies import CopyReader
from .exports import EVERY_SECONDS as EXPORT_SECONDS

BEAT_SECONDS = 1.0
"""How often the follower says how the nodes stand."""
SAVE_SECONDS = 2.0
"""How often how far each copy goes is written down (a follower that dies between two writes makes
the next one send a little again; readers skip what they already have)."""


def attempt_line(attempt: int, from_step: Optional[int]) -> str:
    """The line saying that attempt ``attempt`` begins from step ``from_step`` (None: its program's own)."""
    return json.dumps({ATTEMPT_MARK: attempt, "from_step": from_step}) + "\n"


def side_specs(root: Path, plan: Any, node_rank: int, host: str) -> Optional[list[dict[str, Any]]]:
    """The side files a node's agent (or reader) sends, each from where the copy here ends when the
    node is the host that sent it; None when there is nothing to collect (the nodes' files are here)."""
    if layout.readable_here(plan, root) is not None:
        return None
    return _specs(read_json(layout.live_dir(root) / layout.STATE), node_rank, host)


def _specs(state: Mapping[str, Any], node_rank: int, host: str) -> list[dict[str, Any]]:
    node = (state.get("nodes") or {}).get(str(node_rank)) or {}
    had = node.get("files", {}) if node.get("host") == host else {}
    specs = []
    for name in layout.side_names(node_rank):
        inode, offset = had.get(name) or (0, 0)
        specs.append({"path": name, "ino": inode, "offset": offset})
    return specs


OPEN_COPIES = 256
"""Copies kept open for appending at most (each node has up to four; a launcher of 1,024 nodes holds a
socket per node already, under a limit of often 1,024 descriptors)."""
READ_SECONDS = 2.0
"""How often the copies are read while a run goes where someone listens to its rows (where only the
exports read them, as often as they are written: ``EXPORT_SECONDS``; where neither, every
``INDEX_SECONDS``: the chart index is all that reads them here)."""
EVENT_SECONDS = 0.25
"""How often the copies are read while someone listens to the ranks' events: an elastic run stops its
attempt at a checkpoint to grow, and every second past the save is training done again."""


class Exports(Protocol):
    """What the collector drives of a run's exports (``fsdpctl.live.exports.LiveExports``)."""

    active: bool
    problems: list[str]

    def read_from(self, reader: CopyReader) -> None: ...

    def update(self, *, force: bool = False) -> None: ...

    def close(self) -> None: ...


class Collector:
    """Copies of one run's side files, as the frames arrive (one thread calls it: the follower's loop)."""

    def __init__(self, root: Path, plan: Any, attempt: int = 1, from_step: Optional[int] = None,
                 exports: Optional[Exports] = None):
        """``exports``: brought up to date as the follower says how the nodes stand (``LiveExports``)."""
        self.root = root
        self.exports = exports if exports is not None and exports.active else None
        self.collecting = layout.readable_here(plan, root) is None
        self.attempt = attempt
        private_dir(layout.live_dir(root))
        self.state: dict[str, Any] = read_json(layout.live_dir(root) / layout.STATE) or {"nodes": {}}
        self.state.setdefault("nodes", {})
        self.changed = False
        self.saved_at = 0.0
        self.beat_at = 0.0
        self.since = time.time()
        self.bytes_taken = 0
        self.extra: dict[str, Any] = {}
        self.targets: dict[tuple[int, str], Path] = {}
        self.open_copies: dict[Path, int] = {}
        """Descriptors appending to the copies, the least recently written first (``_appender``)."""
        self.live = layout.live_dir(root)
        self.plan = plan
        self.from_step = from_step
        self.charts: Optional[Any] = None  # the run's chart index, kept as the copies grow (a ChartStore)
        self.reader: Optional[CopyReader] = None
        """The one reader of the copies here: the charts and the exports take their rows from it."""
        self.charts_changed = False
        self.listeners: list[Callable[[dict[str, Any]], None]] = []
        """Told of every event row the copies bring (``on_events``)."""
        self.row_listeners: list[Callable[[str, dict[str, Any]], None]] = []
        """Told of every training and validation row the copies bring (``on_rows``)."""
        self.index_at = self.read_at = time.monotonic()
        self.problems: list[str] = []
        """What went wrong with the charts or the exports (said once each; the run goes on)."""
        if self.collecting and attempt > int(self.state.get("attempt") or 1):
            self._mark_attempt(attempt, from_step)
        self.state["attempt"] = attempt

    # ---- what each node is asked to send ---------------------------------------------------------
    def specs(self, node_rank: int, host: str) -> Optional[list[dict[str, Any]]]:
        """``side_specs`` as this collector has it."""
        return _specs(self.state, node_rank, host) if self.collecting else None

    # ---- what arrives ----------------------------------------------------------------------------
    def take(self, node_rank: int, host: str, index: int, inode: int, offset: int, data: bytes) -> None:
        """Bytes of the node's ``index``-th side file from ``offset`` of the file ``inode``."""
        names = layout.side_names(node_rank)
        if not self.collecting or not 0 <= index < len(names) or not data:
            return
        name = names[index]
        node = self.state["nodes"].setdefault(str(node_rank), {"host": host, "files": {}})
        if node.get("host") != host:
            node.update(host=host, files={})  # a spare in the node's place: its files are others
        target = self.targets.get((node_rank, name))
        if target is None:  # made once
            target = self.targets[(node_rank, name)] = layout.collected(self.root, node_rank, name)
            private_dir(target.parent)
        inode_had, offset_had = node["files"].get(name) or (0, 0)
        goes_on = inode == inode_had and offset == offset_had
        prefix = b""
        if name == layout.METRICS and self.attempt > 1 and target not in self.open_copies and not _size(target):
            # a copy begun by a later attempt (a node it grew by) says whose its rows are, as the others do
            prefix = attempt_line(self.attempt, self.from_step).encode()
        if name in layout.WHOLE and offset == 0:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _write_all(fd, data)
            finally:
                os.close(fd)
        else:
            if not goes_on and not _ends_a_line(target):
                prefix = b"\n"  # what was cut short stays a line of its own, the new file's first too
            _write_all(self._appender(target), prefix + data)
        node["files"][name] = [inode, offset + len(data)]
        self.bytes_taken += len(data)
        self.changed = True

    def _appender(self, target: Path) -> int:
        """A descriptor appending to ``target``, kept open (a frame then costs a write, not an open, a
        write and a close), the ``OPEN_COPIES`` used last at most."""
        fd = self.open_copies.pop(target, None)
        if fd is None:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if len(self.open_copies) >= OPEN_COPIES:
                os.close(self.open_copies.pop(next(iter(self.open_copies))))
        self.open_copies[target] = fd  # (the newest last)
        return fd

    def _close_copies(self) -> None:
        for fd in self.open_copies.values():
            os.close(fd)
        self.open_copies.clear()

    def _mark_attempt(self, attempt: int, from_step: Optional[int]) -> None:
        """A later attempt begins: each metrics copy says so, so readers drop the rows the failed one
        wrote past the step this one resumes from."""
        for rank in self.state["nodes"]:
            target = layout.collected(self.root, int(rank), layout.METRICS)
            if target.exists():
                with target.open("ab") as handle:
                    handle.write((b"" if _ends_a_line(target) else b"\n") +
                                 attempt_line(attempt, from_step).encode())

    # ---- the follower's word ---------------------------------------------------------------------
    def beat(self, nodes: Callable[[], Sequence[Mapping[str, Any]]], *, force: bool = False, ended: bool = False,
             extra: Optional[Mapping[str, Any]] = None) -> None:
        """Say how the nodes stand (``nodes()``, asked only when it is said: every ``BEAT_SECONDS``,
        or now with ``force``; ``extra``: what the backend adds, such as the scheduler's word on the
        job), and write down how far each copy goes (every ``SAVE_SECONDS``)."""
        now = time.time()
        if extra is not None:
            self.extra = dict(extra)
        if force or ended or now - self.beat_at >= BEAT_SECONDS:
            self.beat_at = now
            write_json_atomic(self.live / layout.FOLLOWER, compact=True, data={
                "pid": os.getpid(), "host": socket.gethostname(), "since": round(self.since, 3),
                "at": round(now, 3), "attempt": self.attempt, "ended": ended, "collecting": self.collecting,
                "bytes": self.bytes_taken, "nodes": [dict(n) for n in nodes()], **self.extra})
        if self.changed and (force or ended or now - self.saved_at >= SAVE_SECONDS):
            self.save()
        if ended:
            self._close_copies()  # (a later frame opens its copy again)
        index_due = ended or time.monotonic() - self.index_at >= INDEX_SECONDS
        every = self._read_every()
        if index_due or (every is not None and time.monotonic() - self.read_at >= every):
            self._guarded("reading the copies", self.read)
        if index_due:
            self.keep_index()
        if self.exports is not None:
            self._guarded("exports", lambda: self.exports.update(force=ended))

    def _read_every(self) -> Optional[float]:
        """How often the copies are read between two index times (None: only then)."""
        if self.listeners:
            return EVENT_SECONDS
        if self.row_listeners:
            return READ_SECONDS
        return EXPORT_SECONDS if self.exports is not None else None

    def on_events(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """``listener(row)`` for every event row (``fsdpctl.node.events``) the copies bring, from the
        first read on (the copies are then read every ``EVENT_SECONDS``)."""
        self.listeners.append(listener)

    def on_rows(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """``listener(kind, row)`` for every training and validation row the copies bring (``train``
        or ``val``; in step order within an attempt), from the first read on (the copies are then read
        every ``READ_SECONDS``)."""
        self.row_listeners.append(listener)

    def event(self, row: dict[str, Any]) -> None:
        """The reader's event consumer: each listener told."""
        for listener in self.listeners:
            listener(row)

    def row(self, kind: str, row: dict[str, Any]) -> None:
        """The reader's row consumer: each row listener told (the charts and the exports take the rows
        themselves)."""
        for listener in self.row_listeners:
            listener(kind, row)

    def attempt_began(self, from_step: int) -> None:
        """(The charts and the exports take the attempts.)"""

    def samples(self, samples: list[dict[str, Any]]) -> None:
        """(The charts and the exports take the samples.)"""

    def read(self) -> bool:
        """Read what the copies gained into the charts and the exports (one reader for both); True
        when anything came. The first time, from where the run's chart index stops."""
        from .charts import ChartStore

        self.read_at = time.monotonic()
        if self.charts is None:
            self.charts = ChartStore(self.root, self.plan, getattr(self.plan, "world_size", None))
            self.reader = self.charts.reader
            self.charts.load_index()  # (before the exports take any row: they go on from the same place)
            if self.exports is not None:
                self.exports.read_from(self.reader)
            self.reader.add(self)
        came = self.charts.update()
        self.charts_changed = self.charts_changed or came
        return came

    def keep_index(self) -> None:
        """Bring the run's chart index up to date with the copies (``chart_index``): a page opens on a
        run of any length from it. What cannot be read or written now is left to the next time."""
        self.index_at = time.monotonic()
        if self.charts is None:
            self._guarded("reading the copies", self.read)
        if self.charts is not None and (self.charts_changed or not self.charts.index_path.exists()):
            self.charts_changed = False
            self._guarded("the chart index", self.charts.save_index)

    def _guarded(self, what: str, action: Callable[[], Any]) -> None:
        """The collector's edge: nothing of the charts or the exports stops the follower (its run goes
        on, its copies are kept); each failure is said once, in the run's notes."""
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - a healthy run's follow never ends for a view of it
            said = f"{what}: {type(exc).__name__}: {exc}"
            if said not in self.problems:
                self.problems.append(said)

    def close(self) -> None:
        """The follower is done with the run: the exports' last word (after the run's end is recorded)."""
        self._close_copies()
        if self.exports is not None:
            self._guarded("exports", self.exports.close)

    def save(self) -> None:
        self.saved_at = time.time()
        self.changed = False
        write_json_atomic(self.live / layout.STATE, self.state, compact=True)


def listen(collector: Optional[Collector], *takers: Any) -> None:
    """Hand the run's collector to whoever of a follower's sink and watch listens to the run's rows (a
    ``listen(collector)`` method: an elastic run's growth takes the checkpoint events, a restarting
    run's recovery clock the training rows). Nothing without a collector here (another process
    collects the run)."""
    if collector is None:
        return
    for taker in takers:
        hear = getattr(taker, "listen", None)
        if callable(hear):
            hear(collector)


def with_export_notes(outcome: Outcome, collector: Optional[Collector]) -> Outcome:
    """Once the run's end is recorded: the exports' last word, and what they could not write as the
    outcome's notes (the run itself is not failed by an export)."""
    if collector is None:
        return outcome
    collector.close()
    problems = (*getattr(collector.exports, "problems", ()), *collector.problems,
                *(collector.reader.problems if collector.reader is not None else ()))
    return dataclasses.replace(outcome, notes=(*outcome.notes, *problems)) if problems else outcome


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _ends_a_line(path: Path) -> bool:
    """The file is empty or its last byte is a newline."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return True
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) == b"\n"
    except OSError:
        return True
