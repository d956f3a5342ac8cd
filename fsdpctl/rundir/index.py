"""The registry index: one row per run of a runs directory, kept in ``<runs dir>/.index.json`` so that
listing 1,000 runs reads one file and stats a few thousand, instead of parsing every run's profile.

A row is what ``fsdpctl runs`` and the dashboard's runs page show of a run, made from its run.json,
plan.json and the newest line of its metrics (``make_row``: no profile parsed, no plan built). Beside
it the index keeps the stamp of every file and folder the row was made from (modification time,
size, inode; taken before they were read): a row is made again only when one of them changed, rows
of deleted runs are dropped, and a missing or unreadable index is rebuilt from the run directories.

The index is a cache that every reader checks against the files, so nothing else has to keep it:
``RunDir.change`` writes run.json alone, and the next reader finds that run's stamp changed and
makes its row again. Two processes that save the index at once lose nothing but work: whichever row
the other wrote is, at worst, made again by the next reader. A row whose files changed within the
last second (a clock tick may hide a second change in it) is made again by the next reader too.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..live import layout
from .paths import RUN_ID_PATTERN, read_json, write_json_atomic
from .record import RunRecord

INDEX_NAME = ".index.json"
"""The index's file in the runs directory (hidden, and no run id: ``list_runs`` passes it by)."""
VERSION = 1
TAIL_BYTES = 16 << 10
"""Of a run's metrics, what a row reads for its newest step, loss and tokens/s."""
SETTLE_NS = 1_000_000_000
"""A row made from files changed this recently is made again by the next reader."""

Stamp = Optional[list[int]]
_SAVING = threading.Lock()
"""One save at a time in this process (the temporary file's name is the process's)."""


def stamp_of(path: str | Path) -> Stamp:
    """What tells a file's or a folder's versions apart (None: it is not there)."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return [found.st_mtime_ns, found.st_size, found.st_ino]


@dataclass(frozen=True)
class Listed:
    """One run as the index lists it: its directory, its row, and the stamps of its run.json and
    plan.json when the row was made."""

    path: Path
    row: Mapping[str, Any]
    record_stamp: tuple[Stamp, Stamp]

    def current(self) -> bool:
        """Its run.json and plan.json are still those the row was made from."""
        return (stamp_of(os.path.join(self.path, "run.json")),
                stamp_of(os.path.join(self.path, "plan.json"))) == self.record_stamp


class _PlanFiles:
    """What ``layout`` reads of a plan, from plan.json as it is (a row needs no profile parsed)."""

    def __init__(self, data: Mapping[str, Any]):
        self.run_dir = str(data.get("run_dir") or "")
        self.shared_run_dir = bool(data.get("shared_run_dir"))
        self.num_nodes = int(data.get("num_nodes") or 0)
        self.nodes = [_Node(int(n.get("node_rank", 0))) for n in data.get("nodes") or ()]


class _Node:
    def __init__(self, node_rank: int):
        self.node_rank = node_rank


def _metrics_places(root: Path, plan: _PlanFiles) -> list[Path]:
    """The folders where a run's metrics files appear (a new file changes its folder's stamp): the
    nodes' own folder where it is readable here, else the collected copies' folders, those that exist
    and the first missing one of each (its parent's stamp tells when it comes)."""
    where = layout.readable_here(plan, root)
    if where is not None:
        return [where, where / layout.TELEMETRY]
    live = layout.live_dir(root)
    places = [live]
    if live.is_dir():
        for rank in layout.node_ranks(plan):
            node = layout.collected(root, rank, layout.METRICS).parent
            places.append(node)
            if node.is_dir():
                places.append(layout.collected(root, rank, layout.telemetry_name(rank)).parent)
    return places


def last_metrics(texts: list[str]) -> dict[str, Any] | None:
    """The newest training metrics line (one with a loss) in the first text that has one."""
    for text in texts:
        for line in reversed(text.strip().splitlines()):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and "loss" in data:
                return data
    return None


def make_row(root: Path) -> tuple[dict[str, Any], list[str], list[Stamp]]:
    """A run's row, from its run.json, plan.json and the end of its metrics (no profile parsed, no plan
    built), with what it was made from (paths relative to ``root`` where they are under it) and their
    stamps, taken before they were read. Raises KeyError, ValueError, TypeError or OSError for a
    directory that is no run (yet)."""
    record_stamps = [stamp_of(root / "run.json"), stamp_of(root / "plan.json")]
    plan = read_json(root / "plan.json")
    record = RunRecord.from_json(read_json(root / "run.json"), run_id=str(plan["run_id"]),
                                 profile=str(plan.get("profile_name")), backend=str(plan.get("backend")))
    plan_files = _PlanFiles(plan)
    places = _metrics_places(root, plan_files)
    place_stamps = [stamp_of(p) for p in places]
    files = layout.metrics_files(root, plan_files)
    file_stamps = [stamp_of(p) for p in files]
    newest: dict[str, Any] = {}
    if files:
        from ..metrics.gpu_samples import newest_text

        newest = last_metrics([newest_text(p, TAIL_BYTES) for p in files]) or {}
    first = record.attempts[0] if record.attempts else None
    command = plan.get("command") or ()
    total = (plan.get("train") or {}).get("steps") if not command else None
    row = {"run_id": str(plan["run_id"]), "state": str(record.state), "profile": record.profile,
           "backend": record.backend, "num_nodes": record.num_nodes, "plan_nodes": plan.get("num_nodes"),
           "attempt": record.attempt,
           "created_at": record.created_at, "started_at": record.started_at or record.submitted_at,
           "first_started_at": (first.started_at if first else None) or record.started_at or record.submitted_at,
           "ended_at": record.finished_at or record.stopped_at, "exit_code": record.exit_code,
           "logs_complete": record.logs_complete, "recoveries": list(record.recoveries()),
           "step": newest.get("step"), "total_steps": total if isinstance(total, int) else None,
           "loss": newest.get("loss"), "tokens_per_s": newest.get("tokens_per_s"),
           "command": " ".join(command) if command else None}
    watched = ["run.json", "plan.json", *(_relative(p, root) for p in [*places, *files])]
    return row, watched, [*record_stamps, *place_stamps, *file_stamps]


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _dir_mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class RegistryIndex:
    """The rows of every run in ``runs_dir``, read from its index file (once per instance; after that
    from memory) and checked against each run's files on every ``runs``. Safe to share between threads."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = runs_dir
        self.path = runs_dir / INDEX_NAME
        self._entries: Optional[dict[str, dict[str, Any]]] = None
        self._lock = threading.Lock()

    def runs(self) -> list[Listed]:
        """Every run, oldest first (by the time in its run id, as ``list_runs``), each row current."""
        with self._lock:
            return self._runs()

    def _runs(self) -> list[Listed]:
        dirty = self._entries is None and self._load()
        entries = self._entries if self._entries is not None else {}
        found = self._run_dirs()
        listed = []
        for name in found:
            root = os.path.join(self.runs_dir, name)  # strings: 1,000 runs, a few thousand paths
            entry = entries.get(name)
            if entry is None or not self._holds(entry, root):
                entry = self._make(Path(root))
                if entry is None:
                    entries.pop(name, None)
                    continue
                entries[name] = entry
                dirty = dirty or entry["settled"]
            listed.append(Listed(Path(root), entry["row"], (entry["stamps"][0], entry["stamps"][1])))
        for gone in set(entries) - set(found):
            del entries[gone]
            dirty = True
        if dirty:
            self._save(entries)
        return listed

    def _load(self) -> bool:
        """The index file's entries into memory; True when it has to be written again (missing,
        unreadable, another version)."""
        data = read_json(self.path)
        entries = data.get("runs") if data.get("version") == VERSION else None
        self._entries = {k: v for k, v in entries.items() if isinstance(v, dict)} if isinstance(entries, dict) else {}
        return not isinstance(entries, dict)

    def _run_dirs(self) -> list[str]:
        """The names of the run directories, in ``list_runs``'s order (the time in the run id, then
        the directory's modification time for runs of the same second)."""
        try:
            with os.scandir(self.runs_dir) as scan:
                entries = [(match["stamp"], e.name) for e in scan
                           if (match := RUN_ID_PATTERN.match(e.name)) and e.is_dir()]
        except OSError:
            return []
        seconds = Counter(second for second, _ in entries)
        return [name for _, name in sorted(entries, key=lambda e: (
            e[0], _dir_mtime(self.runs_dir / e[1]) if seconds[e[0]] > 1 else 0.0))]

    @staticmethod
    def _holds(entry: dict[str, Any], root: str) -> bool:
        """The entry was made from the run's files as they are, and they had settled."""
        try:
            watched, stamps = entry["watched"], entry["stamps"]
            return (entry["settled"] is True and isinstance(entry["row"], dict)
                    and watched[:2] == ["run.json", "plan.json"]
                    and all(stamp_of(os.path.join(root, w)) == s for w, s in zip(watched, stamps, strict=True)))
        except (KeyError, TypeError, ValueError):
            return False

    @staticmethod
    def _make(root: Path) -> Optional[dict[str, Any]]:
        began = time.time_ns()
        try:
            row, watched, stamps = make_row(root)
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a run being created, or a directory that is not one
        settled = all(s is None or s[0] < began - SETTLE_NS for s in stamps)
        return {"row": row, "watched": watched, "stamps": stamps, "settled": settled}

    def _save(self, entries: dict[str, dict[str, Any]]) -> None:
        if not self.runs_dir.is_dir() or (not entries and not self.path.exists()):
            return
        with _SAVING:
            try:
                write_json_atomic(self.path, {"version": VERSION, "runs": entries}, compact=True)
            except OSError:
                pass  # a runs directory this user cannot write: every reader makes the rows itself
