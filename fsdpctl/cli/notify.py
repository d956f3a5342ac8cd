"""``fsdpctl notify --test``: one test notice to every target of a profile's ``notify``, and what came back."""

from __future__ import annotations

import json

import typer

from .complete import profile_completion


def notify(
    profile: str = typer.Option(..., "--profile", "-p", help="Cluster profile (name or path).",
                                autocompletion=profile_completion),
    test: bool = typer.Option(False, "--test", help="Send one test notice to every target now."),
    as_json: bool = typer.Option(False, "--json", help="Print each target's answer as JSON."),
) -> None:
    """Send a test notice to every target of PROFILE's notify section (apprise URLs, secret URLs
    read from this environment, a command), once each, and print what came back: ok, or the error.
    Exits 1 when any target failed."""
    from ..api.notifying import send_test
    from ..errors import UsageError

    if not test:
        raise UsageError("notify: nothing to do", "add --test to send a test notice to every target")
    answers = send_test(profile)
    if as_json:
        typer.echo(json.dumps([{"target": name, "ok": error is None, "error": error} for name, error in answers],
                              indent=2))
    else:
        for name, error in answers:
            typer.echo(f"{name}: {'ok' if error is None else 'failed: ' + error}")
    if any(error is not None for _, error in answers):
        raise typer.Exit(1)
