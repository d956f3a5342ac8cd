"""``fsdpctl stacks``: every rank's Python stack on every node, grouped, the odd ones first."""

from __future__ import annotations

import json
from typing import Optional

import typer

from .complete import run_completion


def stacks(
    run_id: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix); default: the latest run.",
                                          autocompletion=run_completion),
    as_json: bool = typer.Option(False, "--json", help="Every node's answer as JSON (every thread, every frame)."),
    all_threads: bool = typer.Option(False, "--all-threads", help="Show every thread of each group, not only "
                                     "the main one (native frames included where py-spy read them)."),
    no_py_spy: bool = typer.Option(False, "--no-py-spy", help="Python frames from fsdpctl's own dump handler "
                                   "only, even where a node has py-spy (which pauses each rank a moment)."),
    native: bool = typer.Option(False, "--native", help="C/C++ frames too, where py-spy reads the stacks (slower: "
                                "a rank waiting in a collective takes py-spy about half a second to unwind)."),
    flight: bool = typer.Option(False, "--flight", help="Also have every rank dump torch's flight recorder "
                                "(into flight/ in its run directory; `fsdpctl fetch RUN flight` brings them)."),
) -> None:
    """Where is every rank now? One command per node reads every rank's stack (py-spy where the node
    has it, else the dump handler fsdpctl installs in each rank) and prints ranks standing at the same
    Python frames as one group ("ranks 0-2 on n1,n2"), the odd ones first, each named by its innermost
    frame of user code. Exit 1 when no rank answered."""
    import fsdpctl

    with fsdpctl.get_run(run_id) as run:
        report = run.stacks(flight=flight, py_spy=not no_py_spy, native=native)
    if as_json:
        typer.echo(json.dumps(report.nodes, indent=2))
    else:
        typer.echo(f"run {run.run_id}: " + "\n".join(report.render(all_threads=all_threads)))
    raise typer.Exit(0 if report.answered else 1)
