"""TensorBoard event files written with the standard library alone (no TensorFlow, tensorboardX or protobuf).

An events file is a sequence of TFRecords: the data's length (uint64, little-endian), the masked CRC32C of
those 8 bytes, the data, the masked CRC32C of the data. Each record's data is a serialized
``tensorflow.Event``; the few fields used here are encoded by hand::

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

The first record carries ``file_version: "brain.Event:2"``, as TensorBoard's own writer does; each scalar is
then one Event with one Value. Fields go out in field-number order, as protobuf itself serializes them.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import socket
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

FILE_VERSION = b"brain.Event:2"
_FLUSH_AT_BYTES = 1 << 20  # past this much buffered, write it out: memory stays bounded between flushes
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_CACHE_LIMIT = 4096  # a run has tens of tags (and record lengths); the cap only bounds a caller making them up

# One counter per process, as TensorBoard's ``_global_uid``: two writers opened in the same second in the same
# process still get different file names.
_file_counter = itertools.count()


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli's polynomial, bit-reversed
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as TFRecord checksums it.

    One table lookup per byte: slicing-by-4/8 or a 16-bit table measured at most 1.5x faster in CPython
    (the loop's bytecode dominates, not the lookups), not worth the tables.
    """
    crc = 0xFFFFFFFF
    table = _CRC_TABLE  # a local: the loop below is the writer's hot path
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C: rotated right by 15 bits plus a constant (so a CRC of CRCs stays sound)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_header_crcs: dict[int, bytes] = {}


def tf_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = len(data)
    header_crc = _header_crcs.get(length)
    if header_crc is None:  # scalars of one tag have the same length: its header's CRC is computed once
        header_crc = struct.pack("<I", masked_crc32c(struct.pack("<Q", length)))
        if len(_header_crcs) < _CACHE_LIMIT:
            _header_crcs[length] = header_crc
    return struct.pack("<Q", length) + header_crc + data + struct.pack("<I", masked_crc32c(data))


def _varint(number: int) -> bytes:
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # finite but past float32's range: IEEE rounding (what TensorFlow does) gives +-inf
        return struct.pack("<f", math.copysign(math.inf, value))


def _tag_prefix(tag: str) -> bytes:
    """Everything of a scalar Event from the summary field up to the float, which depends on the tag alone."""
    if not isinstance(tag, str):
        raise TypeError(f"a TensorBoard tag is a string, not {type(tag).__name__}: {tag!r}")
    if not tag:
        raise ValueError("a TensorBoard tag cannot be empty")
    try:
        encoded = tag.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: protobuf strings must be valid UTF-8, readers reject it
        raise ValueError(f"TensorBoard tag {tag!r} is not valid UTF-8: {exc.reason}") from None
    value = b"\x0a" + _varint(len(encoded)) + encoded + b"\x15"  # Value.tag (1, bytes), then simple_value (2, fixed32)
    value_length = len(value) + 4
    summary = b"\x0a" + _varint(value_length) + value  # Summary.value (1, bytes)
    return b"\x2a" + _varint(len(summary) + 4) + summary  # Event.summary (5, bytes)


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """One serialized ``tensorflow.Event`` holding the scalar ``tag`` = ``value`` at ``step``."""
    return _scalar_event(_tag_prefix(tag), value, step, wall_time)


def _scalar_event(prefix: bytes, value: float, step: int, wall_time: float) -> bytes:
    step = operator.index(step)  # an int (numpy's too), never a float silently truncated
    if not _INT64_MIN <= step <= _INT64_MAX:
        raise ValueError(f"step {step} does not fit TensorBoard's int64")
    # int64 varints are two's complement on 64 bits: a negative step is 10 bytes, as protobuf writes it
    return (b"\x09" + struct.pack("<d", wall_time) + b"\x10" + _varint(step & 0xFFFFFFFFFFFFFFFF)
            + prefix + _float32(float(value)))


def version_event(wall_time: float) -> bytes:
    """The Event every events file starts with: its wall time and ``file_version: "brain.Event:2"``."""
    return b"\x09" + struct.pack("<d", wall_time) + b"\x1a" + _varint(len(FILE_VERSION)) + FILE_VERSION


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
        # TensorBoard's own name: it sorts a folder's files by this timestamp, so keep its zero padding
        path = folder / (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
                         f".{next(_file_counter)}{suffix}")
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
        self._prefixes: dict[str, bytes] = {}
        self.path, self._file = _new_events_file(folder, suffix)
        self._add(version_event(time.time()))
        self.flush()  # TensorBoard sees a valid (empty) run as soon as the writer exists, as with its own writer

    def scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Add ``tag`` = ``value`` at ``step`` (at ``wall_time``, seconds since the epoch; now by default).

        The value is stored as float32, as TensorBoard's ``simple_value`` is; NaN and infinities are kept.
        """
        prefix = self._prefixes.get(tag)
        if prefix is None:
            prefix = _tag_prefix(tag)
            if len(self._prefixes) >= _CACHE_LIMIT:
                self._prefixes.clear()
            self._prefixes[tag] = prefix
        when = time.time() if wall_time is None else float(wall_time)
        self._add(_scalar_event(prefix, value, step, when))

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
