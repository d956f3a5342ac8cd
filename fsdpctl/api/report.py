"""``report``: how runs went, from their metrics: losses, throughput, time per step, memory per rank,
the straggler named, restarts; side by side for several runs; figures with ``plot``."""

from __future__ import annotations

from typing import Optional, Union

from ..metrics.summary import Report
from .options import PathLike
from .registry import get_run
from .run import Run
from .summaries import report_of

__all__ = ["Report", "report"]


def report(runs: Union[str, Run, list[Union[str, Run]], None] = None, *, plot: Optional[PathLike] = None,
           fetch: bool = True, runs_dir: Optional[PathLike] = None, tensorboard: Optional[PathLike] = None,
           html: Optional[PathLike] = None) -> Report:
    """Report on ``runs`` (ids or ``Run``s; default: the latest run): their metrics (the copies its
    follower kept, else brought back from the nodes), summed up and, with ``plot`` (a folder), drawn
    as PNG figures (loss, tokens/s, compute time per rank as a heat map, memory per rank), several runs
    overlaid; with ``tensorboard`` (a folder), written as TensorBoard event files into
    ``<folder>/<run_id>/`` (as ``export.tensorboard`` writes them live); with ``html`` (a file),
    their dashboard pages side by side in one file that opens without any network."""
    given = runs if isinstance(runs, list) else [runs]
    handles = [r if isinstance(r, Run) else get_run(r, runs_dir=runs_dir) for r in given]
    return report_of(handles, plot=plot, fetch=fetch, tensorboard=tensorboard, html=html)
