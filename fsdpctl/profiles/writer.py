"""A cluster profile written as YAML text, with a comment per host saying what was found there.

Values are written as JSON scalars (JSON strings are YAML's double-quoted strings), so any name or
path arrives as itself; the loader then reads the text back as any profile is read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))


@dataclass
class ProfileText:
    """The profile's fields in the order they are written, with their comments."""

    name: str
    header: list[str] = field(default_factory=list)
    """Comment lines at the top (what was found on each host)."""
    lines: list[str] = field(default_factory=list)

    def field(self, key: str, value: Any, comment: str = "", indent: int = 0) -> None:
        if value is None:
            return
        note = f"  # {comment}" if comment else ""
        self.lines.append(f"{' ' * indent}{key}: {_value(value)}{note}")

    def section(self, key: str, values: Sequence[tuple[str, Any, str]]) -> None:
        shown = [(k, v, c) for k, v, c in values if v is not None]
        if shown:
            self.lines.append(f"{key}:")
            for sub, value, comment in shown:
                self.field(sub, value, comment, indent=2)

    def hosts(self, hosts: Sequence[dict[str, Any]], comments: Sequence[str]) -> None:
        self.lines.append("hosts:")
        for host, comment in zip(hosts, comments, strict=True):
            first = True
            for key, value in host.items():
                if value is None:
                    continue
                lead = "  - " if first else "    "
                self.lines.append(f"{lead}{key}: {_value(value)}" + (f"  # {comment}" if first and comment else ""))
                first = False

    def comment(self, lines: Sequence[str]) -> None:
        """Lines written as comments where the profile has got to (a section to fill in by hand)."""
        self.lines += [f"# {line}" for line in lines]

    def text(self) -> str:
        return "".join(f"# {line}\n" if line else "#\n" for line in self.header) + "".join(
            f"{line}\n" for line in self.lines)


def gpu_memory_text(mib: Optional[int]) -> Optional[str]:
    """GPU memory as the profile writes it (``81559MiB``)."""
    return f"{mib}MiB" if mib else None
