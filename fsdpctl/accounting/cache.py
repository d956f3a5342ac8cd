"""A run's goodput account for the views that show it as the run goes (``top``, ``Run.watch``, the
dashboard, ``report --html``): counted from the run's files, at most every ``COUNT_EVERY_S`` while it is
live (the account reads every row of the run), and once more after it ended."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from .account import CATEGORIES
from .render import one_line

COUNT_EVERY_S = 30.0
"""A live run's account is counted again at most this often by the views."""
COST_SHARE = 0.05
"""... and no more often than keeps counting under this share of the time: the account reads every row
of the run (about 1.1 s per hour of a run of 8 ranks: bench/goodput_account.py), so a day-long run's is
counted every 10 minutes or so."""
_COUNTED: dict[str, tuple[float, float, bool, Optional[dict[str, Any]], Optional[str]]] = {}
"""Run directory -> (when counted, what it took, whether the run had ended then, the account as JSON,
its line)."""


def due(counted_at: float, took: float, now: float, every: float = COUNT_EVERY_S, share: float = COST_SHARE) -> bool:
    """Whether an account counted at ``counted_at`` (monotonic), in ``took`` seconds, is due again: ``every``
    seconds on, and never more often than keeps counting under ``share`` of the time."""
    return now - counted_at >= max(every, took / share)


def counted(run: Any) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """The run's goodput account as JSON (with its categories' labels) and as one line, for the views
    (``top``, the dashboard, ``report --html``): counted again once due (``due``) while the run was
    live, and once more after it ended; (None, None) where it has none or cannot be counted.
    ``run``: a Run."""
    key = str(run.path)
    over = run.info.state.is_over
    known = _COUNTED.get(key)
    if known is not None and (known[2] or (not over and not due(known[0], known[1], time.monotonic()))):
        return known[3], known[4]
    began = time.monotonic()
    try:
        account = run.goodput(fetch=False)
    except Exception:  # noqa: BLE001 - a view shows the rest of the run without it
        account = None
    data = None if account is None else {**account.to_json(), "labels": dict(CATEGORIES)}
    line = None if account is None else one_line(account)
    _COUNTED[key] = (time.monotonic(), time.monotonic() - began, over, data, line)
    return data, line


def counted_json(run: Any) -> Optional[dict[str, Any]]:
    """``counted``'s JSON alone (the dashboard's run page)."""
    return counted(run)[0]


def account_of_dir(run: Any, files: Optional[list[Path]] = None) -> Optional[Any]:
    """The account of a run from its directory (a ``RunDir``), asking no node: from ``files`` (its
    metrics and telemetry here; default: the copies its collector keeps), with the telemetry of its
    earlier attempts where the nodes' run directory is readable here (each attempt moves its own
    aside); None: no attempt timed yet. An ended run's is kept in its directory (``KEPT_NAME``) and read
    back while those files are unchanged."""
    from ..live import layout
    from .account import account
    from .facts import read_rows, run_facts

    files = list(layout.metrics_files(run.root, run.plan) if files is None else files)
    where = layout.readable_here(run.plan, run.root)
    if where is not None:
        files += sorted(where.glob("attempts/*/telemetry/node*.jsonl"))
    record = run.record
    stamp = _stamp([run.paths.run_record, *files])
    kept = _kept(run.root / KEPT_NAME, stamp) if record.state.is_over else None
    if kept is not None:
        return kept
    spares = len(getattr(run.profile, "spares", None) or ())
    facts = run_facts(record, run.plan, run.root, read_rows(files), spares=spares)
    counted_now = account(facts) if facts is not None else None
    if counted_now is not None and record.state.is_over:
        _keep(run.root / KEPT_NAME, stamp, counted_now)
    return counted_now


KEPT_NAME = "goodput.json"
"""An ended run's account, kept in its directory with the sizes and times of the files it was counted
from: read back while they are unchanged (``report --goodput`` over a month of runs reads no rows)."""


def _stamp(paths: list[Path]) -> list[list[Any]]:
    out = []
    for path in paths:
        try:
            found = path.stat()
        except OSError:
            continue
        out.append([str(path), found.st_size, found.st_mtime_ns])
    return sorted(out)


def _kept(path: Path, stamp: list[list[Any]]) -> Optional[Any]:
    """The account kept at ``path`` if it was counted from the files as ``stamp`` has them (None: not)."""
    from .account import Account

    try:
        data = json.loads(path.read_text())
        if data.get("stamp") != stamp:
            return None
        kept = data["account"]
        return Account(wall_s=kept["wall_s"], seconds=kept["seconds"],
                       gpu_s={k: v * 3600 for k, v in kept["gpu_hours"].items()},
                       held_gpu_s=kept["held_gpu_hours"] * 3600, steps_redone=kept["steps_redone"],
                       straggler_s=kept["straggler_s"], async_save_s=kept["async_save_s"],
                       async_wait_s=kept["async_wait_s"], async_written_s=kept["async_written_s"],
                       eval_s=kept["eval_s"], queued_s=kept["queued_s"], attempts=kept["attempts"],
                       minutes=kept.get("minutes"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # none kept, or by another version: counted again


def _keep(path: Path, stamp: list[list[Any]], counted_now: Any) -> None:
    from ..rundir.paths import write_json_atomic

    try:  # private, as every file of the run's (whatever the umask), and never read half-written
        write_json_atomic(path, {"stamp": stamp, "account": counted_now.to_json()}, compact=True)
    except OSError:
        pass  # a run directory we may not write (another user's): counted again next time
