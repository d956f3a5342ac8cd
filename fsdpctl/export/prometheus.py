"""The Prometheus text exposition format (version 0.0.4), for node_exporter's textfile collector.

``render`` turns metric families into the text; ``write_textfile`` puts it where node_exporter reads it
(``--collector.textfile.directory``), replacing the file atomically so a scrape never sees half of it.
Only gauges and counters, and no timestamps: the textfile collector rejects samples that carry their own.
"""

from __future__ import annotations

import errno
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

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
    """``(labels, value)`` pairs; each label set at most once in a family."""


def escape_label_value(value: str) -> str:
    """``value`` as it goes between a label's double quotes: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """HELP text escaped as the spec says: backslash and newline (a double quote stays as it is there)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value as Go's ParseFloat reads it: ``NaN``, ``+Inf``, ``-Inf``, else Python's shortest repr."""
    number = float(value)
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return repr(number)


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


def _label_text(name: str, labels: Mapping[str, str]) -> str:
    parts = []
    for label, value in labels.items():
        if not isinstance(label, str) or not LABEL_NAME.fullmatch(label):
            raise ValueError(f"metric {name!r}: invalid label name {label!r}: it must match {LABEL_NAME.pattern}")
        if label.startswith("__"):  # the spec reserves these for Prometheus itself (__name__, __address__)
            raise ValueError(f"metric {name!r}: label name {label!r} starts with '__', reserved by Prometheus")
        if not isinstance(value, str):
            raise TypeError(f"metric {name!r}: label {label!r} has a {type(value).__name__} value; labels are "
                            f"strings: {value!r}")
        _check_utf8(value, f"metric {name!r}: label {label!r}")
        parts.append(f'{label}="{escape_label_value(value)}"')
    return "{" + ",".join(parts) + "}" if parts else ""


def render(families: Sequence[Family]) -> str:
    """The exposition text of ``families``, in the given order, each with its HELP and TYPE lines.

    A family without samples still gets its HELP and TYPE (both Prometheus's and prometheus_client's
    parsers accept that; the Go one simply drops the family). Raises ValueError naming the first bad metric
    name, label name, label value, duplicate family or duplicate label set.
    """
    lines: list[str] = []
    seen: set[str] = set()
    for family in families:
        _check_family(family, seen)
        seen.add(family.name)
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        label_sets: set[frozenset[tuple[str, str]]] = set()
        for labels, value in family.samples:
            text = _label_text(family.name, labels)
            key = frozenset(labels.items())  # {a, b} and {b, a} are one series
            if key in label_sets:  # node_exporter fails the whole file on a series collected twice
                raise ValueError(f"metric {family.name!r}: label set {dict(labels)!r} appears twice")
            label_sets.add(key)
            lines.append(f"{family.name}{text} {format_value(value)}")
    return "".join(line + "\n" for line in lines)  # the last line too: the Go parser wants every line ended


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
