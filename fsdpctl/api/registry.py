"""Finding runs: one by id (``get_run``), or every run in the runs directory (``runs``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .options import PathLike
from .run import Run


def get_run(run_id: Optional[str] = None, *, runs_dir: Optional[PathLike] = None) -> Run:
    """The run ``run_id`` (a unique prefix will do; None: the latest run) in ``runs_dir`` (default
    ``$FSDPCTL_RUNS_DIR``, else ``./runs``). Raises UsageError when there is no such run."""
    from ..rundir.paths import find_run
    from ..rundir.rundir import load_run

    return Run(load_run(find_run(run_id, Path(runs_dir) if runs_dir is not None else None)))


def runs(*, runs_dir: Optional[PathLike] = None) -> list[Run]:
    """Every run in ``runs_dir`` (default ``$FSDPCTL_RUNS_DIR``, else ``./runs``), oldest first.
    The records of live runs a scheduler runs are brought up to date first (one question to the
    scheduler for all of them), so each ``run.info`` says what ``run.status()`` would; no node is asked."""
    from ..backends import backend_class
    from ..errors import UsageError
    from ..rundir.paths import list_runs
    from ..rundir.rundir import RunDir, load_run

    found = [load_run(path) for path in list_runs(Path(runs_dir) if runs_dir is not None else None)]
    live: dict[str, list[RunDir]] = {}
    for run_dir in found:
        record = run_dir.record
        if not record.state.is_over:
            live.setdefault(record.backend, []).append(run_dir)
    for name, group in live.items():
        try:
            backend = backend_class(name)
        except UsageError:
            continue  # a backend no longer installed here: its runs are listed as recorded
        backend.refresh_records(group)
    return [Run(run_dir) for run_dir in found]
