"""The output of ``srun --label`` (one task per node), back into each task's own answer."""

from __future__ import annotations

import re

_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def split_tasks(stdout: str, begin: str, end: str) -> dict[int, str]:
    """Each task's text, by task number.

    srun cuts long lines into labelled pieces; an answer's JSON has no newline of its own (json.dumps
    escapes them), so between the ``begin`` and ``end`` sentinels the pieces are joined back without one."""
    tasks: dict[int, list[str]] = {}
    for line in stdout.split("\n"):
        if match := _LABEL.match(line):
            tasks.setdefault(int(match.group(1)), []).append(match.group(2))
    joined = {}
    for task, lines in tasks.items():
        text = "\n".join(lines)
        start = text.rfind(begin)
        stop = text.find(end, start + 1) if start >= 0 else -1
        if stop > 0:
            text = text[:start + len(begin)] + text[start + len(begin):stop].replace("\n", "") + text[stop:]
        joined[task] = text
    return joined
