"""Where a run's live data is in its directory here, in one place.

A run whose directory on the nodes is this one (the ``local`` backend; Slurm's shared storage) has its
files where the nodes write them: ``metrics.jsonl``, ``summary.json``, ``gpu/node<R>.jsonl``,
``telemetry/node<R>.jsonl``. Any
other run's collector keeps a copy of each node's under ``live/node<R>/`` with the same relative
names. Beside them: ``live/follower.json``, what the collecting follower last said (when, how each
node stood), ``live/collect.json``, how far each copy goes, and ``live/collector.lock``, held by the
one process collecting (a viewer that can take it knows nobody is). ``live/owner.lock`` is held by the
process that may start the run's next attempt: its launcher, or a detached run's follower.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

LIVE = "live"
METRICS = "metrics.jsonl"
TELEMETRY = "telemetry"
"""Where the ranks of a user's program write their rows (``fsdpctl.node.telemetry``): one file per node."""
SUMMARY = "summary.json"
FOLLOWER = "follower.json"
STATE = "collect.json"
LOCK = "collector.lock"
OWNER_LOCK = "owner.lock"


def gpu_samples_name(node_rank: int) -> str:
    """A node's GPU samples, relative to a run directory (``fsdpctl.node.gpu_watch`` writes them)."""
    return f"gpu/node{node_rank}.jsonl"


def telemetry_name(node_rank: int) -> str:
    """A node's rows of fsdpctl's rank telemetry (a user's program), relative to a run directory."""
    return f"{TELEMETRY}/node{node_rank}.jsonl"


def side_names(node_rank: int) -> tuple[str, ...]:
    """What a node sends of its run directory beside its log, in the order of the agent's list."""
    return (METRICS, SUMMARY, gpu_samples_name(node_rank), telemetry_name(node_rank))


WHOLE = frozenset({SUMMARY})
"""Side files written whole (and renamed into place): a copy that begins again is rewritten; the
others are JSON lines, appended to."""


def live_dir(root: Path) -> Path:
    return root / LIVE


@functools.lru_cache(maxsize=16384)
def collected(root: Path, node_rank: int, name: str) -> Path:
    """The copy here of a node's ``name`` (relative to its run directory). Kept: a collector asks for every
    node's copies every two seconds, and a path costs more to make than to look up."""
    return root / LIVE / f"node{node_rank}" / name


@functools.lru_cache(maxsize=256)
def is_here(run_dir_on_nodes: str, root: Path) -> bool:
    """The nodes write into this very directory (kept: resolving both paths walks every folder of them, and
    a collector asks three times a read)."""
    try:
        return Path(run_dir_on_nodes).expanduser().resolve() == root.resolve()
    except OSError:
        return False


def readable_here(plan: Any, root: Path) -> Optional[Path]:
    """The nodes' run directory as this machine reads it, where it does (this very directory, or
    storage this machine shares with the nodes: the plan's ``shared_run_dir``); None: only the
    collector's copies are here."""
    if is_here(plan.run_dir, root):
        return root
    if getattr(plan, "shared_run_dir", False):
        return Path(plan.run_dir).expanduser()
    return None


def node_ranks(plan: Any) -> list[int]:
    return [n.node_rank for n in plan.nodes] or list(range(plan.num_nodes))


def node_files(root: Path, plan: Any, name: str) -> list[Path]:
    """Every copy of ``name`` a view reads: the file itself where the nodes' directory is readable
    here, else each node's collected copy (those that exist), by node rank."""
    where = readable_here(plan, root)
    if where is not None:
        path = where / name
        return [path] if path.exists() else []
    return [p for rank in node_ranks(plan) if (p := collected(root, rank, name)).exists()]


def telemetry_files(root: Path, plan: Any) -> list[Path]:
    """Every node's rank telemetry here (the nodes' own files, or the collected copies)."""
    where = readable_here(plan, root)
    if where is not None:
        return sorted((where / TELEMETRY).glob("node*.jsonl"))
    return [p for rank in node_ranks(plan) if (p := collected(root, rank, telemetry_name(rank))).exists()]


def metrics_files(root: Path, plan: Any) -> list[Path]:
    """Every file of metrics rows a view reads: the run's ``metrics.jsonl`` copies, then the rank
    telemetry's (``fsdpctl.metrics.rows`` reads both)."""
    return node_files(root, plan, METRICS) + telemetry_files(root, plan)


def gpu_files(root: Path, plan: Any) -> list[Path]:
    """Every node's GPU samples here (the nodes' own files, or the collected copies)."""
    where = readable_here(plan, root)
    if where is not None:
        return sorted((where / "gpu").glob("node*.jsonl"))
    return [p for rank in node_ranks(plan) if (p := collected(root, rank, gpu_samples_name(rank))).exists()]


_HELD: dict[Path, int] = {}
"""The run directories whose collector lock this process holds, and how many holders within it: a
launcher holds it across a run's attempts, and each attempt's follower inside that."""
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def collector_lock(root: Path, wait: float = 1.0) -> Iterator[bool]:
    """Held while this process collects the run (True), or not got (False: another process does).
    The kernel lets it go when the process dies, however it dies: a viewer then finds it free.
    Within one process it may be taken again (it is then already held)."""
    key = root.resolve()
    with _HELD_LOCK:
        if key in _HELD:
            _HELD[key] += 1
            again = True
        else:
            again = False
    if again:
        try:
            yield True
        finally:
            with _HELD_LOCK:
                _HELD[key] -= 1
        return
    folder = live_dir(root)
    folder.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
    got = False
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except BlockingIOError:  # another collector, or a viewer's look at it this instant
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        if got:
            with _HELD_LOCK:
                _HELD[key] = 1
        yield got
    finally:
        if got:
            with _HELD_LOCK:
                _HELD.pop(key, None)
        os.close(fd)


def collector_alive(root: Path) -> Optional[bool]:
    """Whether a process holds the run's collector lock now (None: no run of this version collected)."""
    path = live_dir(root) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets a shared lock go
    return False


@contextlib.contextmanager
def owner_lock(root: Path) -> Iterator[None]:
    """Held, this process's pid inside, while it may start the run's next attempt (a launcher, or a
    detached run's follower, restarting it): whoever else follows the run follows its next attempts,
    and for a detached run neither acts on it nor records its end. The kernel lets it go when the
    process dies."""
    folder = live_dir(root)
    folder.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder / OWNER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)


def owned_elsewhere(root: Path) -> bool:
    """Another process (a launcher, a detached run's follower) owns the run now (``owner_lock``)."""
    try:
        fd = os.open(live_dir(root) / OWNER_LOCK, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip()
        return holder != str(os.getpid())
    finally:
        os.close(fd)
    return False


def ownerless(root: Path, detached: bool) -> bool:
    """A detached run that no other process owns: whoever follows it acts for it (ends it on a hang,
    stops its other nodes when one fails, records its end)."""
    return detached and not owned_elsewhere(root)
