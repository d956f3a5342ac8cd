"""``fsdpctl report``: how runs went, from their metrics; figures with ``--plot``; runs side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..metrics.rank_table import FOLD_ABOVE
from .complete import run_completion


def report(
    run_ids: Optional[list[str]] = typer.Argument(None, metavar="[RUN_ID]...", autocompletion=run_completion,
                                                  help="Runs (ids or unique prefixes); default: the latest run."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="DIR", help="Write PNG figures into DIR (needs "
                                        "matplotlib: pip install 'fsdpctl[report]')."),
    as_json: bool = typer.Option(False, "--json", help="The figures as JSON (stdout is data), every rank's "
                                 "included."),
    every_rank: bool = typer.Option(False, "--ranks", help="Every rank in the table of ranks (above "
                                    f"{FOLD_ABOVE} ranks it shows the slowest, the median, the fastest and the "
                                    "straggler)."),
    no_fetch: bool = typer.Option(False, "--no-fetch", help="Use the metrics already brought back; ask no node."),
    html: Optional[Path] = typer.Option(None, "--html", metavar="FILE", help="Write the runs' pages (charts, nodes, "
                                        "attempts, lines, plan; side by side) into one HTML file that opens "
                                        "without any network."),
    tensorboard: Optional[Path] = typer.Option(None, "--tensorboard", metavar="DIR", help="Write each run's "
                                               "TensorBoard event files into DIR/<run_id>/ (as export.tensorboard "
                                               "does live)."),
    goodput: bool = typer.Option(False, "--goodput", help="Where the GPU-hours of many runs went: the runs given, "
                                 "else every run (of --since, --profile); totals by category, the worst runs."),
    since: Optional[str] = typer.Option(None, "--since", metavar="AGE|DATE", help="With --goodput: runs created "
                                        "since then (30m, 12h, 7d, 2w, or a date such as 2026-11-21)."),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", metavar="NAME", help="With --goodput: runs of "
                                          "this profile only."),
) -> None:
    """Final and best losses, tokens/s, MFU, time per step, memory per rank, the straggler named,
    each rank's compute, collective wait, data wait and peak memory, attempts; several runs side by
    side."""
    import fsdpctl

    if goodput or since is not None or profile is not None:
        across = fsdpctl.goodput(list(run_ids) if run_ids else None, since=since, profile=profile,
                                 fetch=not no_fetch and bool(run_ids))
        typer.echo(json.dumps(across.to_json(), indent=2) if as_json else across.text)
        return
    result = fsdpctl.report(list(run_ids) if run_ids else None, plot=plot, fetch=not no_fetch,
                            tensorboard=tensorboard, html=html)
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        return
    typer.echo(result.as_text(every_rank))
    for path in result.plots:
        typer.echo(f"wrote {path}")
    if html is not None:
        typer.echo(f"wrote {html}")
    if tensorboard is not None:
        typer.echo(f"wrote TensorBoard event files into {tensorboard}/<run_id>/ (tensorboard --logdir {tensorboard})")
