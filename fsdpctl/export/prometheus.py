"""The Prometheus text exposition format (version 0.0.4), for node_exporter's textfile collector: the text
prometheus_client's ``generate_latest`` writes, byte for byte (the one module that imports prometheus_client;
``pip install 'fsdpctl[export]'``).

``render`` turns metric families into the text; ``write_textfile`` puts it where node_exporter reads it
(``--collector.textfile.directory``), replacing the file atomically so a scrape never sees half of it. Only
gauges and counters, and no timestamps: the textfile collector rejects samples that carry their own.

Not ``generate_latest`` of a registry itself: it escapes and checks every label of every sample again
(137 ms per write at 64 nodes x 8 GPUs, against 9 ms here), and the text is the same; the tests hold the two
to the same bytes. Its value formatting (``floatToGoString``) is used as it is. Not prometheus_client's
``write_to_textfile``: it leaves the file with the umask's mode (0600 under a strict one, which
node_exporter, running as its own user, cannot read) and does not fsync before the rename.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import prometheus_client  # noqa: F401 - the package first: where it is missing, so is this module
from prometheus_client.utils import floatToGoString

# The spec's patterns. fullmatch, not match with ``$``: ``$`` also matches before a trailing newline.
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("gauge", "counter")


@dataclass(frozen=True)
class Family:
    """One metric: its name, its HELP text, its type, and its samples (a label set and a value each)."""

    name: str
    """The metric name, e.g. ``fsdpctl_gpu_sm_clock_mhz``; a counter's conventionally ends in ``_total``."""
    help: str
    """One line (or more: newlines are escaped) saying what the metric measures, and in which unit."""
    type: Literal["gauge", "counter"]
    samples: Sequence[tuple[Mapping[str, str], float]] = ()
    """``(labels, value)`` pairs: every sample with the same label names, each label set at most once."""


def _check_utf8(text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: the format is UTF-8, a parser would choke on the file
        raise ValueError(f"{what} is not valid UTF-8 ({exc.reason}): {text!r}") from None


def _check_family(family: Family, seen: set[str]) -> None:
    if not isinstance(family.name, str) or not METRIC_NAME.fullmatch(family.name):
        raise ValueError(f"invalid Prometheus metric name {family.name!r}: it must match {METRIC_NAME.pattern}")
    if family.name in seen:  # a second HELP/TYPE for one name is an error for node_exporter's parser
        raise ValueError(f"metric {family.name!r} appears twice: one family per name")
    if family.type not in TYPES:
        raise ValueError(f"metric {family.name!r}: type {family.type!r} is not one of {', '.join(TYPES)}")
    if not isinstance(family.help, str):
        raise TypeError(f"metric {family.name!r}: help is a string, not {type(family.help).__name__}")
    _check_utf8(family.help, f"help of {family.name!r}")


def _check_label_names(name: str, labels: Iterable[str]) -> None:
    for label in labels:
        if not isinstance(label, str) or not LABEL_NAME.fullmatch(label):
            raise ValueError(f"metric {name!r}: invalid label name {label!r}: it must match {LABEL_NAME.pattern}")
        if label.startswith("__"):  # the spec reserves these for Prometheus itself (__name__, __address__)
            raise ValueError(f"metric {name!r}: label name {label!r} starts with '__', reserved by Prometheus")


def _label_values(name: str, label_names: tuple[str, ...], names: frozenset[str], labels: Mapping[str, str]
                  ) -> list[str]:
    if labels.keys() != names:
        raise ValueError(f"metric {name!r}: label set {dict(labels)!r} has other names than the family's first "
                         f"sample ({', '.join(label_names) or 'none'}): one set of label names per family")
    values = [labels[label] for label in label_names]
    try:
        "".join(values).encode("utf-8")  # one check for the whole set: this runs for every sample
    except (TypeError, UnicodeEncodeError):
        for label, value in zip(label_names, values, strict=True):  # which one
            if not isinstance(value, str):
                raise TypeError(f"metric {name!r}: label {label!r} has a {type(value).__name__} value; labels are "
                                f"strings: {value!r}") from None
            _check_utf8(value, f"metric {name!r}: label {label!r}")
    return values


def _help_line(name: str, text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("\n", "\\n")  # (a HELP text keeps its quotes)
    return f"# HELP {name} {escaped}\n"


def _quoted(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(families: Sequence[Family]) -> str:
    """The exposition text of ``families`` (what prometheus_client's ``generate_latest`` writes of a
    registry holding them as its metric families), in the given order, each with its HELP and TYPE lines;
    a sample's labels sorted by name.

    Checked as node_exporter's textfile collector (the Go parser of the classic format) reads it:
    prometheus_client itself takes UTF-8 names, which its text format then writes with underscores in
    place of other characters, renaming the metric. A family without samples still gets its HELP and TYPE
    (both Prometheus's and prometheus_client's parsers accept that; the Go one simply drops the family). A
    counter's samples are named ``<name>_total`` (prometheus_client's convention; a name already ending in
    ``_total`` keeps it).

    Raises ValueError naming the first bad metric name, label name, label value, duplicate family or
    duplicate label set (each a whole-file error for node_exporter)."""
    seen: set[str] = set()
    out: list[str] = []
    # A label set shown once per dict: the families of one GPU share its labels (the dicts live as long as
    # ``families``, so no id is reused meanwhile).
    shown_of: dict[int, str] = {}
    for family in families:
        _check_family(family, seen)
        seen.add(family.name)
        name = family.name
        if family.type == "counter":
            name = (name[:-len("_total")] if name.endswith("_total") else name) + "_total"
        out.append(_help_line(name, family.help))
        out.append(f"# TYPE {name} {family.type}\n")
        label_names: tuple[str, ...] = tuple(family.samples[0][0]) if family.samples else ()
        _check_label_names(family.name, label_names)
        names = frozenset(label_names)
        in_order = sorted(label_names)
        label_sets: set[str] = set()
        for labels, value in family.samples:
            shown = shown_of.get(id(labels))
            if shown is None or labels.keys() != names:
                _label_values(family.name, label_names, names, labels)
                shown = shown_of[id(labels)] = ",".join(f'{label}="{_quoted(labels[label])}"' for label in in_order)
            if shown in label_sets:  # node_exporter fails the whole file on a series collected twice
                raise ValueError(f"metric {family.name!r}: label set {dict(labels)!r} appears twice")
            label_sets.add(shown)  # {a, b} and {b, a} are one series: both are shown sorted
            out.append(f"{name}{{{shown}}} {floatToGoString(value)}\n" if shown else
                       f"{name} {floatToGoString(value)}\n")
    return "".join(out)


def write_textfile(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically: a temporary file in the same folder, fsync, rename.

    The folder must exist (it is node_exporter's textfile directory, made when node_exporter was set up);
    a missing one raises FileNotFoundError saying so.
    """
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"the textfile collector's folder for {path.name} does not exist "
                                f"(create it, or point node_exporter's --collector.textfile.directory at an "
                                f"existing one)", str(folder))
    # The temporary name ends in .tmp, never .prom: the collector reads only *.prom, so it never sees it
    # half-written. Same folder, so os.replace is a rename within one filesystem, hence atomic.
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            # 0644, not mkstemp's 0600 (nor whatever the umask leaves): node_exporter runs as its own user
            # (node_exporter, nobody) and must be able to read the file
            os.fchmod(file.fileno(), 0o644)
            file.write(text.encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())  # the data is on disk before the name points at it: no empty file after a crash
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise
