"""``fsdpctl profile``: chosen ranks' torch.profiler traces of the same steps of a live run, merged."""

from __future__ import annotations

import json
from typing import Optional

import typer

from .complete import run_completion


def profile(
    run_id: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix); default: the latest run.",
                                          autocompletion=run_completion),
    steps: int = typer.Option(3, "--steps", min=1, max=100, help="Steps to record."),
    ranks: str = typer.Option("auto", "--ranks", help="Which ranks: a list (0,3), all, straggler, or auto: the "
                              "straggler, the two ranks nearest the median, and rank 0."),
    shapes: bool = typer.Option(False, "--shapes", help="Record the operators' input shapes (a larger trace)."),
    stack: bool = typer.Option(False, "--stack", help="Record the Python stack of each operator (larger, slower)."),
    max_mb: float = typer.Option(100.0, "--max-mb", min=1.0, help="Each rank's trace at most this many MB, "
                                 "gzipped; a larger one keeps its earliest events, and the note says so."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=1.0, help="Seconds to wait for the traces "
                                            "(default: from the run's step time)."),
    as_json: bool = typer.Option(False, "--json", help="The summary as JSON."),
) -> None:
    """Profile a few steps of a live run, with no code: each chosen rank starts torch.profiler at the
    same step, records --steps steps, and writes its trace; fsdpctl brings them back and merges them
    into one trace (one process per rank, clocks aligned, steps marked) with a summary of where each
    rank's time went. A run launched with --profile-steps: gathers its traces once it has ended.
    Exit 1 when no trace came back.

    \b
    fsdpctl profile                      (the latest run: the straggler, two median ranks, rank 0)
    fsdpctl profile RUN --steps 5 --ranks all"""
    import fsdpctl

    from ..api.tracing import gather_launched, trace_steps

    with fsdpctl.get_run(run_id) as run:
        done = None
        if run.info.state.is_over:
            done = gather_launched(run)
        if done is None:
            done = trace_steps(run, steps=steps, ranks=ranks, shapes=shapes, stack=stack, max_mb=max_mb,
                               timeout=timeout)
    if as_json:
        typer.echo(json.dumps({"trace": str(done.trace), "folder": str(done.folder), **done.summary}, indent=1))
    else:
        typer.echo("\n".join(done.lines()))
    raise typer.Exit(0 if done.ok else 1)
