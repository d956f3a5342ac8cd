"""The output of ``srun --label`` (one task per node), back into each task's own answer."""

from __future__ import annotations

import re

_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


def split_tasks(stdout: str, begin: str, end: str) -> dict[int, str]:
    """Each task's text, by task number.

    srun cuts long lines into labelled pieces wherever a task's write ended (Python writes a pipe 8 KiB
    at a time), sentinels included. An answer's JSON has no newline of its own (json.dumps escapes
    them), so the answer is found in the task's pieces joined without one and put back whole at the
    end of its text, where the readers (``rfind(begin)``) take it from."""
    tasks: dict[int, list[str]] = {}
    for line in stdout.split("\n"):
        if match := _LABEL.match(line):
            tasks.setdefault(int(match.group(1)), []).append(match.group(2))
    joined = {}
    for task, lines in tasks.items():
        text, flat = "\n".join(lines), "".join(lines)
        start = flat.rfind(begin)
        stop = flat.find(end, start + 1) if start >= 0 else -1
        if stop > 0:
            text += "\n" + flat[start:stop + len(end)]
        joined[task] = text
    return joined
