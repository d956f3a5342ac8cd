"""TensorBoard event files: each scalar a ``tensorflow.Event`` of tensorboardX's protobuf messages, serialized
by protobuf, framed as a TFRecord whose checksums come from google-crc32c (C). The one module that imports
tensorboardX and google_crc32c; ``pip install 'fsdpctl[export]'`` installs both.

An events file is a sequence of TFRecords: the data's length (uint64, little-endian), the masked CRC32C of
those 8 bytes, the data, the masked CRC32C of the data. The first record carries ``file_version:
"brain.Event:2"``, as TensorBoard's own writer does; each scalar is then one Event with one ``simple_value``.

Not tensorboardX's ``SummaryWriter``: measured (``bench/export_writers.py``) at about 11x the CPU per scalar
of this writer (a multiprocessing queue to a thread, numpy per value, CRC32C in a Python loop unless the
``crc32c`` package is there), it also rewrites tags it finds unusual, names two writers opened in the same
second alike (the second truncates the first's file) and fsyncs at every flush.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import google_crc32c

FILE_VERSION = "brain.Event:2"
_FLUSH_AT_BYTES = 1 << 20  # past this much buffered, write it out: memory stays bounded between flushes
_CACHE_LIMIT = 4096  # a run has tens of tags (and record lengths); the cap only bounds a caller making them up

# One counter per process, as TensorBoard's ``_global_uid``: two writers opened in the same second in the same
# process still get different file names.
_file_counter = itertools.count()


def _tensorboardx_messages() -> tuple[Any, Any]:
    """tensorboardX's ``Event`` and ``Summary`` messages. Its package imports torch wherever torch is installed
    (for its graph and image summaries): a second and a few hundred MB the launcher never needs, so an import
    of torch fails while tensorboardX loads (it falls back to numpy), unless torch is already loaded."""
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None  # type: ignore[assignment]  # ``import torch`` now raises ImportError
    try:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
    finally:
        if hidden and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return Event, Summary


Event, Summary = _tensorboardx_messages()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as TFRecord checksums it (google-crc32c's C implementation)."""
    return google_crc32c.value(data)


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C: rotated right by 15 bits plus a constant (so a CRC of CRCs stays sound)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_header_crcs: dict[int, bytes] = {}


def tf_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    header_crc = _header_crcs.get(len(data))
    if header_crc is None:  # scalars of one tag have the same length: its header's CRC is computed once
        header_crc = struct.pack("<I", masked_crc32c(length))
        if len(_header_crcs) < _CACHE_LIMIT:
            _header_crcs[len(data)] = header_crc
    return length + header_crc + data + struct.pack("<I", masked_crc32c(data))


def _check_tag(tag: str) -> None:
    if not isinstance(tag, str):
        raise TypeError(f"a TensorBoard tag is a string, not {type(tag).__name__}: {tag!r}")
    if not tag:
        raise ValueError("a TensorBoard tag cannot be empty")
    try:
        tag.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: protobuf strings must be valid UTF-8, readers reject it
        raise ValueError(f"TensorBoard tag {tag!r} is not valid UTF-8: {exc.reason}") from None


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """One serialized ``tensorflow.Event`` holding the scalar ``tag`` = ``value`` (as float32) at ``step``.

    protobuf refuses a step that is not an int (TypeError) or past int64 (ValueError); a finite value past
    float32's range is rounded to an infinity, as TensorFlow rounds it.
    """
    _check_tag(tag)
    return _scalar_event(tag, value, step, wall_time)


def _scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
    return Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


def _scalars_event(values: Sequence[tuple[str, float]], step: int, wall_time: float) -> bytes:
    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values])
    return Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


def version_event(wall_time: float) -> bytes:
    """The Event every events file starts with: its wall time and ``file_version: "brain.Event:2"``."""
    return Event(wall_time=wall_time, file_version=FILE_VERSION).SerializeToString()


def _make_folder(folder: Path) -> None:
    """``folder`` and any missing parents, each 0700 when created here (a run's metrics are its owner's)."""
    missing = []
    for path in (folder, *folder.parents):
        if path.is_dir():
            break
        missing.append(path)
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process: use it as it is
            if not path.is_dir():
                raise


def _new_events_file(folder: Path, suffix: str) -> tuple[Path, BinaryIO]:
    """A new, empty events file in ``folder`` under TensorBoard's name for it, created exclusively."""
    while True:
        # TensorBoard's own name. It reads a folder's files in the order of their names: the timestamp and
        # the counter are zero-padded, so that a process's 10th writer of a second comes after its 9th.
        path = folder / (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
                         f".{next(_file_counter):06d}{suffix}")
        try:
            return path, open(path, "xb")  # noqa: SIM115 (the writer keeps it open across calls; close() closes it)
        except FileExistsError:  # same second, same pid (a reused pid, a forked child): take the next number
            continue


class EventWriter:
    """Appends scalars to a new TensorBoard events file in ``folder``, one file per writer.

    Writes are buffered; :meth:`flush` hands everything so far to the operating system, where TensorBoard
    (which polls its files) reads it. The file is created exclusively: an existing file is never rewritten.
    Not thread-safe: use one writer per thread, or a lock around it. ``path`` is the file it writes.
    """

    def __init__(self, folder: Path, *, suffix: str = "") -> None:
        if "/" in suffix or "\0" in suffix:  # it ends a file name: it must not lead out of the folder
            raise ValueError(f"an events file suffix cannot hold '/' or NUL: {suffix!r}")
        folder = Path(folder)
        _make_folder(folder)
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._tags: set[str] = set()
        """Tags already checked (a run has tens of them, each written thousands of times)."""
        self.path, self._file = _new_events_file(folder, suffix)
        self._add(version_event(time.time()))
        self.flush()  # TensorBoard sees a valid (empty) run as soon as the writer exists, as with its own writer

    def scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Add ``tag`` = ``value`` at ``step`` (at ``wall_time``, seconds since the epoch; now by default).

        The value is stored as float32, as TensorBoard's ``simple_value`` is; NaN and infinities are kept.
        """
        self._checked(tag)
        when = time.time() if wall_time is None else float(wall_time)
        self._add(_scalar_event(tag, value, step, when))

    def _checked(self, tag: str) -> None:
        """Refuse a bad tag (each tag checked once)."""
        if tag not in self._tags:
            _check_tag(tag)
            if len(self._tags) >= _CACHE_LIMIT:
                self._tags.clear()
            self._tags.add(tag)

    def scalars_at(self, step: int, values: Sequence[tuple[str, float]], wall_time: float | None = None) -> None:
        """Add each ``(tag, value)`` of ``values`` at one ``step`` and ``wall_time``, as one Event whose
        summary holds them all (as TensorFlow's merged summaries are written; TensorBoard reads each value
        as its tag's scalar): one record's framing and checksums instead of one per scalar."""
        if not values:
            return
        for tag, _ in values:
            self._checked(tag)
        when = time.time() if wall_time is None else float(wall_time)
        self._add(_scalars_event(values, step, when))

    def scalars(self, items: Iterable[tuple[str, float, int, float | None]]) -> None:
        """Add each ``(tag, value, step, wall_time)`` of ``items``, as :meth:`scalar` does."""
        for tag, value, step, wall_time in items:
            self.scalar(tag, value, step, wall_time)

    def _add(self, event: bytes) -> None:
        if self._file.closed:
            raise ValueError(f"the TensorBoard writer for {self.path} is closed")
        record = tf_record(event)
        self._buffer.append(record)
        self._buffered += len(record)
        if self._buffered >= _FLUSH_AT_BYTES:
            self.flush()

    def flush(self) -> None:
        """Hand every buffered record to the operating system, where TensorBoard's polling reader finds it.

        No fsync: the records are readable by any process once the OS has them; durability across a crash
        of the machine is not worth a disk sync every few seconds for live metrics. After a write error (a
        full disk) the file may end in part of a record, where readers stop: open a new writer.
        """
        if self._file.closed:
            return
        if self._buffer:
            self._file.write(b"".join(self._buffer))
            self._buffer.clear()
            self._buffered = 0
        self._file.flush()

    def close(self) -> None:
        """Flush and close the file; closing twice is harmless."""
        if not self._file.closed:
            try:
                self.flush()
            finally:
                self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()
