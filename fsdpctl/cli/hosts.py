"""``fsdpctl hosts``: a profile's hosts as the next run would use them, and putting an excluded one back."""

from __future__ import annotations

import json
from typing import Optional

import typer

from .complete import hosts as host_completion
from .complete import profile_completion


def hosts(
    profile: str = typer.Option(..., "--profile", "-p", help="Cluster profile (name or path).",
                                autocompletion=profile_completion),
    restore: Optional[str] = typer.Option(None, "--restore", help="Put this excluded host back, once doctor's "
                                          "fast checks pass on it."),
    exclude: Optional[str] = typer.Option(None, "--exclude", autocompletion=host_completion,
                                         help="Leave this host out of every run of the "
                                          "profile until it is restored (a spare takes its place)."),
    reason: str = typer.Option("excluded by hand", "--reason", help="With --exclude: why, as hosts shows it."),
    as_json: bool = typer.Option(False, "--json", help="Print the hosts as JSON."),
) -> None:
    """Every host of PROFILE: active (its node rank in the next run, and the host a spare stands in
    for), spare, or excluded (why, since when, by which run)."""
    import fsdpctl

    from .events import EventPrinter

    found = fsdpctl.hosts(profile, restore=restore, exclude=exclude, reason=reason,
                          on_event=EventPrinter() if restore else None)
    if as_json:
        typer.echo(json.dumps([h.to_json() for h in found], indent=2))
        return
    for host in found:
        typer.echo(host.describe())
