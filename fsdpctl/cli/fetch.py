"""``fsdpctl fetch``: bring what a run wrote on its nodes (under ``$FSDPCTL_RUN_DIR``) back here."""

from __future__ import annotations

import typer

from .complete import run_completion


def fetch(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix).", autocompletion=run_completion),
    path: str = typer.Argument(".", help="File or folder under the run directory on the nodes (default: all the "
                                         "run wrote, but fsdpctl's own copies of code and workload)."),
) -> None:
    """Copy PATH from every node's run directory into runs/<id>/fetched/node<R>/ here."""
    import fsdpctl

    from .events import show_fetched

    with fsdpctl.get_run(run_id) as run:
        fetched = run.fetch(path)
    show_fetched(fetched)
    raise typer.Exit(0 if any(fetched.values()) else 1)
