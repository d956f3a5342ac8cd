"""Every rank's stack, grouped: ranks whose main threads stand at the same Python frames fold into
one group, the smallest groups (the odd ones) come first, and each group is named by its innermost
frame of user code (not the standard library, not an installed package) on one line.

The input is what ``fsdpctl.node.stacks`` prints on each node (one dict per node); the backends
only carry it here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
_OWN_MARKS = ("/fsdpctl/node/startup/", "/fsdpctl/node/telemetry/")
"""fsdpctl's own frames in a rank: its start-up hook and its rank telemetry's wrappers."""
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", *_OWN_MARKS)


def is_fsdpctls(frame: dict[str, Any]) -> bool:
    """A frame of fsdpctl's own code in a rank (a wrapper around the call the rank waits in)."""
    return any(m in str(frame.get("file", "")) for m in _OWN_MARKS)


def is_library(frame: dict[str, Any]) -> bool:
    """A frame of the standard library, an installed package or native code: not the user's."""
    path = str(frame.get("file", ""))
    return (bool(frame.get("native")) or path.startswith("<") or any(m in path for m in _LIBRARY_MARKS)
            or bool(_STDLIB.search(path)))


def main_thread(threads: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The thread that runs the rank's program (py-spy names it; faulthandler's is found by its
    outermost frame)."""
    for thread in threads:
        if thread.get("main"):
            return thread
    return threads[0] if threads else None


MAX_NAME = 100


def where(frame: dict[str, Any]) -> str:
    return f"{frame['file']}:{frame['line']}" if frame.get("line") else str(frame["file"])


def frame_line(frame: dict[str, Any]) -> str:
    """One frame as shown: its function (C++ names cut short) and where."""
    name = str(frame["function"])
    return f"{name if len(name) <= MAX_NAME else name[:MAX_NAME - 3] + '...'}  ({where(frame)})"


def short_where(frame: dict[str, Any]) -> str:
    """``train.py:42`` for user code; ``torch/distributed/distributed_c10d.py:2951`` for a package."""
    path = str(frame["file"])
    for mark in ("/site-packages/", "/dist-packages/"):
        if mark in path:
            path = path.split(mark, 1)[1]
            break
    else:
        if match := _STDLIB.search(path):
            path = path[match.end():]
        else:
            path = path.rsplit("/", 1)[-1]
    return f"{path}:{frame['line']}" if frame.get("line") else path


@dataclass
class RankStack:
    rank: int
    host: str
    node_rank: int | None
    pid: int
    method: str | None
    threads: list[dict[str, Any]]
    error: str | None = None

    @property
    def frames(self) -> list[dict[str, Any]]:
        thread = main_thread(self.threads)
        return thread["frames"] if thread else []

    def key(self) -> tuple:
        """What decides the group: where the main thread's Python frames stand, by file and line (py-spy
        names functions by qualified name, faulthandler by plain name; native frames differ by address)."""
        if self.error and not self.threads:
            return ("error", self.error)
        return tuple((f["file"], f["line"]) for f in self.frames if not f.get("native"))


@dataclass
class Group:
    members: list[RankStack]
    total: int
    frames: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted(m.rank for m in self.members)

    @property
    def hosts(self) -> list[str]:
        return sorted({m.host for m in self.members}, key=lambda h: min(m.rank for m in self.members if m.host == h))

    def headline(self) -> str:
        """The innermost user frame (and the call it waits in), on one line."""
        if self.error:
            return f"no stack: {self.error}"
        python = [f for f in self.frames if not f.get("native")]
        if not python:
            return "no Python frame"
        waits_in = next((f for f in python if not is_fsdpctls(f)), python[0])
        for frame in python:
            if not is_library(frame):
                inside = f", inside {waits_in['function']} ({short_where(waits_in)})" if waits_in is not frame else ""
                return f"{short_where(frame)} in {frame['function']}{inside}"
        return f"{short_where(python[0])} in {python[0]['function']} (no frame of user code)"

    def label(self) -> str:
        return f"{'rank' if len(self.members) == 1 else 'ranks'} {rank_ranges(self.ranks)} on {','.join(self.hosts)}"


def rank_ranges(ranks: list[int]) -> str:
    """0,1,2,5 -> '0-2,5'."""
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}" if rank > start + 1 else f"{start},{rank}")
            start = None
    return ",".join(parts)


def rank_stacks(nodes: list[dict[str, Any]]) -> list[RankStack]:
    """Every rank that any node reported, in rank order."""
    found = []
    for node in nodes:
        for rank in node.get("ranks", []):
            found.append(RankStack(rank["rank"], node.get("host", "?"), node.get("node_rank"), rank.get("pid", 0),
                                   rank.get("method"), rank.get("threads") or [], rank.get("error")))
    return sorted(found, key=lambda r: r.rank)


def group_stacks(stacks: list[RankStack]) -> list[Group]:
    """Identical main-thread stacks folded; the smallest groups first (then by lowest rank)."""
    by_key: dict[tuple, list[RankStack]] = {}
    for stack in stacks:
        by_key.setdefault(stack.key(), []).append(stack)
    groups = [Group(members, len(stacks), members[0].frames,
                    members[0].error if members[0].error and not members[0].threads else None)
              for members in by_key.values()]
    return sorted(groups, key=lambda g: (len(g.members), min(g.ranks)))


def suspect(groups: list[Group]) -> Group | None:
    """The odd one out: the one smallest group of ranks that stand somewhere else than the rest;
    None when every rank stands at the same place or no group is smaller than every other."""
    standing = [g for g in groups if g.error is None]
    if len(standing) < 2:
        return None
    sizes = sorted(len(g.members) for g in standing)
    return standing[0] if sizes[0] < sizes[1] else None


def render(groups: list[Group], nodes: list[dict[str, Any]], all_threads: bool = False,
           stacks: list[RankStack] | None = None) -> list[str]:
    """The grouped report, as lines."""
    total = sum(len(g.members) for g in groups)
    methods = ", ".join(f"{n.get('host', '?')}: {_methods(n)}" for n in nodes)
    lines = [f"{total} rank(s) on {len(nodes)} node(s) ({methods})"]
    odd = suspect(groups)
    for group in groups:
        note = " - the odd one out" if group is odd else ""
        lines += ["", f"{group.label()}  ({len(group.members)} of {total}){note}", f"  at {group.headline()}"]
        if group.error:
            continue
        if all_threads:
            for thread in group.members[0].threads:
                lines.append(f"  thread {thread.get('name')}{' (main)' if thread.get('main') else ''}:")
                lines += [f"    {frame_line(f)}" for f in thread["frames"]]
        else:
            lines += [f"    {frame_line(f)}" for f in group.frames if not f.get("native")]
    for node in nodes:
        if node.get("error"):
            lines += ["", f"{node.get('host', '?')}: {node['error']}"]
    return lines


def _methods(node: dict[str, Any]) -> str:
    if node.get("error"):
        return "unreachable"
    used = sorted({r.get("method") or "none" for r in node.get("ranks", [])})
    return "/".join(used) or "no ranks running"


def summary_line(groups: list[Group]) -> str:
    """One line for a failure summary: who stands apart, and where."""
    odd = suspect(groups)
    if odd is not None:
        return f"{odd.label()} stands apart, at {odd.headline()}"
    standing = [g for g in groups if g.error is None]
    if len(standing) == 1:
        return f"every rank at {standing[0].headline()}"
    if not standing:
        return "no stack could be read"
    return f"ranks stand in {len(standing)} places; the first: {standing[0].label()} at {standing[0].headline()}"


@dataclass(frozen=True)
class StackReport:
    """Every rank's stack of one run, as read just now: ``nodes`` is each node's answer (every thread,
    every frame; ``error`` where a node did not answer), ``groups`` the ranks folded by where they stand."""

    run_id: str
    nodes: list[dict[str, Any]]

    @property
    def ranks(self) -> list[RankStack]:
        """Every rank's stack, by global rank."""
        return rank_stacks(self.nodes)

    @property
    def groups(self) -> list[Group]:
        """The ranks standing at the same frames, one group each, the odd ones first."""
        return group_stacks(self.ranks)

    @property
    def answered(self) -> bool:
        """Some rank's stack was read."""
        return any(node.get("ranks") for node in self.nodes)

    def odd_one_out(self) -> Group | None:
        """The small group of ranks that stand elsewhere than the rest (see ``suspect``)."""
        return suspect(self.groups)

    def render(self, all_threads: bool = False) -> list[str]:
        """The grouped report, as lines."""
        return render(self.groups, self.nodes, all_threads=all_threads)
