"""Host lists as other tools write them: DeepSpeed/MPI hostfiles (``host slots=N``, ``host:N``) and
Slurm node lists (``gpu[01-04,07],login1``), expanded as ``scontrol show hostnames`` does."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import UsageError


@dataclass(frozen=True)
class ListedHost:
    """One host of a list, and the processes the list gives it (None: not said)."""

    host: str
    slots: Optional[int] = None


_SLOTS = re.compile(r"^slots\s*=\s*(\d+)$")
# Open MPI's cap on oversubscription, not a count of processes: accepted and left aside.
_MAX_SLOTS = re.compile(r"^max[_-]slots\s*=\s*\d+$")
_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _is_host(name: str) -> bool:
    """A host name, an IPv4 address, or a bare IPv6 address (no brackets, no port)."""
    if _HOST.match(name):
        return True
    try:
        ipaddress.IPv6Address(name)
    except ValueError:
        return False
    return True


def parse_hostfile(text: str, source: str) -> list[ListedHost]:
    """``host``, ``host slots=N`` (DeepSpeed, Open MPI) or ``host:N`` (MPICH) per line; ``#`` comments.
    A bad line is a one-line error naming the file and the line."""
    hosts: list[ListedHost] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        name, slots = words[0], None
        if ":" in name and name.count(":") == 1 and not name.startswith("["):  # host:N (an IPv6 address has more)
            name, _, count = name.partition(":")
            if not count.isdigit():
                raise UsageError(f"{source}:{number}: {raw.strip()!r}: the part after ':' is not a count",
                                 "write host:N, host slots=N, or the host alone")
            slots = int(count)
        for word in words[1:]:
            if _MAX_SLOTS.match(word):
                continue
            match = _SLOTS.match(word)
            if match is None:
                raise UsageError(f"{source}:{number}: {word!r}: not a slots=N field",
                                 "write host slots=N (DeepSpeed, Open MPI), host:N (MPICH), or the host alone")
            slots = int(match.group(1))
        if not _is_host(name):
            raise UsageError(f"{source}:{number}: {name!r}: not a host name or address", "fix or remove the line")
        if slots == 0:
            raise UsageError(f"{source}:{number}: {name}: 0 slots", "give 1 or more, or remove the host")
        if any(h.host == name for h in hosts):
            raise UsageError(f"{source}:{number}: {name}: listed twice", "list each host once")
        hosts.append(ListedHost(name, slots))
    if not hosts:
        raise UsageError(f"{source}: no hosts in it", "one host per line: host, host slots=N or host:N")
    return hosts


def read_hostfile(path: Path) -> list[ListedHost]:
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--hostfile {path}: {exc.strerror or exc}", "give a readable hostfile") from None
    return parse_hostfile(text, str(path))


def _split_top(text: str) -> list[str]:
    """Split at the commas that are not inside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("a ']' without its '['")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("a '[' without its ']'")
    return [*parts, current]


def _expand(name: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", name)
    if match is None:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    numbers: list[str] = []
    for item in match.group(1).split(","):
        low, dash, high = item.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{item!r} is not a number or a range")
        if dash:
            if int(high) < int(low):
                raise ValueError(f"{item!r} counts down")
            width = len(low) if low.startswith("0") else 0
            numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
        else:
            numbers.append(low)
    return [expanded for number in numbers for expanded in _expand(head + number + tail)]


def expand_nodelist(nodelist: str) -> list[str]:
    """``gpu[01-03,07],login1`` -> gpu01, gpu02, gpu03, gpu07, login1 (several bracket groups too)."""
    if any(char.isspace() for char in nodelist.strip()):
        raise UsageError(f"--nodelist {nodelist!r}: a space in it", "separate nodes with commas, e.g. n1,n2")
    try:
        names = [n for part in _split_top(nodelist.strip()) if part for n in _expand(part.strip())]
    except ValueError as exc:
        raise UsageError(f"--nodelist {nodelist!r}: {exc}", "write it as Slurm does, e.g. gpu[01-04,07]") from None
    if not names:
        raise UsageError(f"--nodelist {nodelist!r}: no nodes in it", "write it as Slurm does, e.g. gpu[01-04,07]")
    return list(dict.fromkeys(names))
