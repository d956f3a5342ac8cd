"""``fsdpctl env``: the Python environments fsdpctl made on a profile's nodes, and pruning them."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Optional

import typer

from .complete import profile_completion


def env(
    profile: str = typer.Option(..., "--profile", "-p", help="Cluster profile (name or path).",
                                autocompletion=profile_completion),
    prune: bool = typer.Option(False, "--prune", help="Remove all but the most recently used environments on "
                               "every node (never one in use, nor the profile's own), and wheels none needs."),
    keep: Optional[int] = typer.Option(None, "--keep", min=1, help="With --prune: how many to keep per node "
                                       "(default: the profile's environment.keep)."),
    make: bool = typer.Option(False, "--make", help="Make the environment on every node now, as launch would "
                              "(ahead of a run), then list."),
    env_from: Optional[Path] = typer.Option(None, "--env-from", metavar="FILE", help="A uv.lock, pyproject.toml or "
                                            "requirements.txt over the profile's environment.file."),
    packages: bool = typer.Option(False, "--packages", help="Print each environment's packages and versions."),
    as_json: bool = typer.Option(False, "--json", help="Print what every node holds as JSON."),
) -> None:
    """List the environments on every node of PROFILE (made from its environment section): each one's
    key, whether the profile runs in it now, when it was made and last used, its size and what it holds.
    Exits 1 when a node could not be asked."""
    from ..api.environments import environments
    from .events import EventPrinter

    nodes = environments(profile, prune=prune, keep=keep, make=make, env_from=env_from,
                         on_event=EventPrinter() if make else None)
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(node) for node in nodes], indent=2))
    else:
        for node in nodes:
            _show(node, packages)
    if any(node.error for node in nodes):
        raise typer.Exit(1)


def _show(node, packages: bool) -> None:
    if node.error:
        typer.echo(f"{node.host}: could not be asked: {node.error}")
        return
    total = sum(e.bytes for e in node.environments)
    typer.echo(f"{node.host}: {len(node.environments)} environment(s) in {node.root}, {total / 1e9:.2f} GB, "
               f"{node.wheels} wheel(s) kept")
    for removed in node.removed:
        typer.echo(f"  removed {removed}")
    for found in node.environments:
        mark = "*" if found.current else " "
        typer.echo(f"{mark} {found.key}  {len(found.packages)} packages  {found.bytes / 1e6:.0f} MB  made "
                   f"{_ago(found.created)}, used {_ago(found.used)}  from {found.source or '?'}"
                   + (f"  ({', '.join(found.names)})" if found.names else ""))
        if packages:
            for name, version in sorted(found.packages.items()):
                typer.echo(f"      {name}=={version}")


def _ago(when: float) -> str:
    seconds = max(0, time.time() - when)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
