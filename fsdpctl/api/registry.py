"""Finding runs: one by id (``get_run``), or every run in the runs directory (``runs``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .run import Run

if TYPE_CHECKING:
    from ..rundir.rundir import RunDir
    from .options import PathLike


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
    from ..rundir.index import RegistryIndex
    from ..rundir.paths import runs_root
    from ..rundir.state import RunState

    # The registry index holds each run's row, checked against its files: no run's profile is parsed
    # here, and a run's plan is read when something asks for it.
    index = RegistryIndex(Path(runs_dir) if runs_dir is not None else runs_root())
    listed = index.runs()
    live: dict[str, list[Path]] = {}
    for item in listed:
        if not RunState.parse(item.row["state"]).is_over:
            live.setdefault(str(item.row["backend"]), []).append(item.path)
    loaded = _refresh_live(live)
    if loaded:
        listed = index.runs()  # the records the scheduler's answers changed: their rows made again
    return [Run._listed(item, loaded.get(item.path)) for item in listed]


def _refresh_live(live: dict[str, list[Path]]) -> dict[Path, RunDir]:
    """Each backend brings the records of its live runs up to date (a scheduler's: one question for
    all); the runs it was given, loaded."""
    if not live:
        return {}
    from ..backends import backend_class
    from ..errors import UsageError
    from ..rundir.rundir import load_run

    loaded: dict[Path, RunDir] = {}
    for name, paths in live.items():
        try:
            backend = backend_class(name)
        except UsageError:
            continue  # a backend no longer installed here: its runs are listed as recorded
        group = [load_run(path) for path in paths]
        backend.refresh_records(group)
        loaded.update((run_dir.root, run_dir) for run_dir in group)
    return loaded
