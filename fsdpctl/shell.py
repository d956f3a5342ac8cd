"""Quoting for POSIX shells, in one place: every command fsdpctl sends is built from these."""

from __future__ import annotations

import shlex
from collections.abc import Sequence


class NodeExpr(str):
    """A word of shell text that must expand on the node (``"$SLURM_NODEID"``); never quoted."""


def quote_path(path: str) -> str:
    """Shell-quote a node-side path, letting a leading ``~/`` expand to the node's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def join_path(base: str, *parts: str) -> str:
    """Join node-side paths without touching the local filesystem (``~`` stays for the node)."""
    text = base.rstrip("/") or "/"
    for part in parts:
        part = part.strip("/") if part not in ("", ".") else ""
        if part.startswith("./"):
            part = part[2:]
        if part:
            text = part if text == "." else f"{text.rstrip('/')}/{part}"
    return text


def shell_join(words: Sequence[str]) -> str:
    """Quote every word for a POSIX shell, except NodeExpr words, which are written as they are."""
    return " ".join(w if isinstance(w, NodeExpr) else shlex.quote(w) for w in words)


OUTPUT_MARK = "<<<FSDPCTL-OUTPUT>>>"


def marked(command: str) -> str:
    """``command`` with a marker line printed first: a chatty shell rc may print before it."""
    return f"echo '{OUTPUT_MARK}'; {command}"


def after_mark(output: str) -> str:
    """What a ``marked`` command printed, without anything a shell rc printed before it."""
    head, sep, tail = output.partition(OUTPUT_MARK + "\n")
    return tail if sep else output


def command_line(program: str, args: Sequence[str]) -> str:
    """One shell command: ``program`` (a node path, ``~`` allowed) and its arguments, each quoted once."""
    return " ".join([quote_path(program), shell_join(args)]) if args else quote_path(program)
