"""Requirements a job needs on every node: read from a requirements file, checked against what a node has.

A line is a PEP 508 requirement (``numpy>=1.24,<2``, ``transformers==4.40.0``, ``flash-attn``);
comments, blank lines and pip's own options are skipped, ``-r other.txt`` is followed. Versions are
compared with ``packaging`` (PEP 440), as pip does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from ..errors import UsageError

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(requirement: str) -> str:
    """``numpy>=1.24`` -> ``numpy``: the distribution a requirement line names."""
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return match.group(1)


def read_requirements(path: Path, seen: Optional[set[Path]] = None) -> tuple[str, ...]:
    """The requirement lines of a requirements file; UsageError naming the file and line for one that
    is not a requirement."""
    from packaging.requirements import InvalidRequirement, Requirement

    path = path.expanduser()
    seen = seen if seen is not None else set()
    if path.resolve() in seen:
        return ()
    seen.add(path.resolve())
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--requirements {path}: cannot be read ({exc.strerror})", "give a requirements.txt") from None
    found: list[str] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            found += read_requirements(path.parent / line.split(None, 1)[1].strip(), seen)
            continue
        if line.startswith("-"):
            continue  # pip's own options (--index-url, -e ...): nothing a node can be checked for
        try:
            Requirement(line)
        except InvalidRequirement as exc:
            raise UsageError(f"{path}:{number}: {line!r} is not a requirement ({exc})",
                             "write name[extras] followed by version specifiers, e.g. numpy>=1.24") from None
        found.append(line)
    return tuple(found)


def unmet(requirement: str, version: Optional[str], python_version: str) -> Optional[str]:
    """Why a node's installed ``version`` does not meet ``requirement`` (None: it does, or the
    requirement's environment marker leaves it out on a node with that Python)."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion

    parsed = Requirement(requirement)
    if parsed.marker is not None and not parsed.marker.evaluate({"python_version": python_version}):
        return None
    if version is None:
        return "not installed"
    try:
        if parsed.specifier and not parsed.specifier.contains(version, prereleases=True):
            return f"{version} installed"
    except InvalidVersion:
        return f"{version} installed (not a version pip can compare)"
    return None
