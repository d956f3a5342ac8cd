"""``fsdpctl logs``: a run's output, merged and prefixed, filtered by node, rank or pattern; ``-f`` follows."""

from __future__ import annotations

import re
from typing import Optional

import typer

from ..errors import UsageError


def logs(
    run_id: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix); default: the latest run."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Follow a running job until it ends."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only lines of this global rank."),
    host: Optional[str] = typer.Option(None, "--host", help="Only lines of this host (as in the profile)."),
    grep: Optional[str] = typer.Option(None, "--grep", help="Only lines matching this regular expression."),
    attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="An earlier attempt's logs (`fsdpctl "
                                          "status` lists them); default: the newest."),
) -> None:
    """Print a run's logs, merged across nodes, each line prefixed with [host rNODE]."""
    from .common import opened_run
    from .launch import follow_run
    from .stream import prefix

    try:
        pattern = re.compile(grep) if grep else None
    except re.error as exc:
        raise UsageError(f"--grep {grep!r}: not a regular expression ({exc})", "escape special characters") from None

    def show(node_rank: int, node_host: str, text: str) -> None:
        if ((host is None or node_host == host) and (rank is None or text.startswith(f"[rank{rank}]:"))
                and (pattern is None or pattern.search(text) is not None)):
            typer.echo(f"{prefix(node_rank, node_host)} {text}")

    with opened_run(run_id) as (run, backend):
        if attempt is not None and attempt > run.attempt:
            raise UsageError(f"--attempt {attempt}: run {run.run_id} has {run.attempt} attempt(s)",
                             f"give --attempt 1 to {run.attempt}, or leave it out for the newest")
        if attempt is not None and attempt < run.attempt and follow:
            raise UsageError(f"--attempt {attempt}: ended; only the newest attempt can be followed",
                             "drop -f to read it, or --attempt to follow the newest")
        if follow:
            state = run.record.get("state")
            if state not in ("running", "starting", "submitted"):
                typer.echo(f"fsdpctl: run {run.run_id} is {state}; showing its logs", err=True)
            raise typer.Exit(follow_run(backend, run, owner=False, sink=show))
        for note in backend.read_logs(run, show, attempt):
            typer.echo(note, err=True)
