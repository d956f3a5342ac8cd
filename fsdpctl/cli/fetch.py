"""``fsdpctl fetch``: bring what a run wrote on its nodes (under ``$FSDPCTL_RUN_DIR``) back here."""

from __future__ import annotations

import typer

from ..errors import UsageError


def fetch(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix)."),
    path: str = typer.Argument(".", help="File or folder under the run directory on the nodes (default: all the "
                                         "run wrote, but fsdpctl's own copies of code and workload)."),
) -> None:
    """Copy PATH from every node's run directory into runs/<id>/fetched/node<R>/ here."""
    from .common import opened_run
    from .launch import show_fetched

    parts = path.split("/")
    if path.startswith(("/", "~")) or ".." in parts:
        raise UsageError(f"{path}: not a path inside the run directory", "give it relative to $FSDPCTL_RUN_DIR, "
                         "e.g. outputs/model.pt")
    with opened_run(run_id) as (run, backend):
        fetched = backend.fetch(run, path)
    show_fetched(fetched)
    raise typer.Exit(0 if any(fetched.values()) else 1)
