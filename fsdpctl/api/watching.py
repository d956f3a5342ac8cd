"""``fsdpctl.watch``: a run (the newest one going, by default) watched as it goes; see ``Run.watch``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Optional

from .options import PathLike

if TYPE_CHECKING:
    from ..live.snapshot import Snapshot

from .run import Run


def watch(run_id: Optional[str] = None, interval: float = 2.0, *, until_over: bool = True,
          runs_dir: Optional[PathLike] = None) -> Iterator[Snapshot]:
    """Snapshots of the run ``run_id`` (a prefix will do; None: the newest run still going, else the
    newest) as it goes; see ``Run.watch``."""
    with run_to_watch(run_id, runs_dir=runs_dir) as run:
        yield from run.watch(interval, until_over=until_over)


def run_to_watch(run_id: Optional[str] = None, *, runs_dir: Optional[PathLike] = None) -> Run:
    """The run ``run_id`` (a prefix will do), or without one the newest run still going, else the newest."""
    from .registry import get_run, runs

    if run_id is not None:
        return get_run(run_id, runs_dir=runs_dir)
    going = [r for r in runs(runs_dir=runs_dir) if not r.info.state.is_over]
    return going[-1] if going else get_run(None, runs_dir=runs_dir)
