"""``report``: how runs went, from their metrics: losses, throughput, time per step, memory per rank,
the straggler named, restarts; side by side for several runs; figures with ``plot``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from ..errors import FsdpctlError, UsageError
from ..metrics.rows import Series, read_run_files
from ..metrics.summary import Report, RunSummary, summarize
from .registry import PathLike, get_run
from .run import Run


def run_series(run: Run, fetch: bool = True) -> tuple[Series, RunSummary]:
    """A run's metrics (brought back from its nodes first when ``fetch``) and their summary."""
    notes: list[str] = []
    if fetch:
        for name in ("metrics.jsonl", "summary.json"):
            try:
                run.fetch(name)
            except (FsdpctlError, OSError) as exc:  # nodes gone: what was fetched before still reports
                notes.append(f"{name} not fetched again ({exc}); reporting what was fetched before")
    fetched = sorted((run.path / "fetched").glob("node*/metrics.jsonl"))
    summary = next(iter(sorted((run.path / "fetched").glob("node*/summary.json"))), None)
    if not fetched:
        raise UsageError(f"report {run.run_id}: no metrics.jsonl from its nodes{'; ' + notes[0] if notes else ''}",
                         "the bundled workload writes one; a program of yours appends JSON lines with a "
                         "\"step\" to $FSDPCTL_RUN_DIR/metrics.jsonl (see README, Reports)")
    series = read_run_files(fetched, run.run_id, summary)
    summary_ = summarize(series, attempts=int(run.info.attempt or 1), state=str(run.info.state))
    summary_.notes = notes
    return series, summary_


def report(runs: Union[str, Run, list[Union[str, Run]], None] = None, *, plot: Optional[PathLike] = None,
           fetch: bool = True, runs_dir: Optional[PathLike] = None) -> Report:
    """Report on ``runs`` (ids or ``Run``s; default: the latest run): their metrics brought back from
    the nodes, summed up and, with ``plot`` (a folder), drawn as PNG figures (loss, tokens/s, compute
    time per rank as a heat map, memory per rank), several runs overlaid."""
    given = runs if isinstance(runs, list) else [runs]
    handles = [r if isinstance(r, Run) else get_run(r, runs_dir=runs_dir) for r in given]
    pairs = [run_series(r, fetch) for r in handles]
    result = Report([p[1] for p in pairs], [p[0] for p in pairs])
    if plot is not None:
        from ..metrics.plots import draw

        result.plots = draw(result.series, result.summaries, Path(plot))
    return result
