"""Shell completion (``fsdpctl --install-completion``, bash, zsh and fish): profile names, run ids,
the hosts of the profile on the command line, and the ranks of the run on it, from what exists here.
Every Tab press starts ``fsdpctl`` anew: these read a folder listing or one small JSON file, never
a profile's YAML through the validator, never the network."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import typer

_HOST = re.compile(r"^\s*-?\s*host:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)


def profile_names(incomplete: str) -> list[str]:
    """The profiles ``--profile`` finds, by name, in search order."""
    from ..profiles.loader import list_profiles

    names = list(dict.fromkeys(entry.name for entry in list_profiles()))
    return [name for name in names if name.startswith(incomplete)]


def _runs_dir() -> Path:
    from ..rundir.paths import RUNS_DIR_ENV

    return Path(os.environ.get(RUNS_DIR_ENV) or "runs")


def run_ids(incomplete: str) -> list[str]:
    """The run ids in the runs directory, newest first."""
    try:
        runs = [p for p in _runs_dir().iterdir() if (p / "plan.json").is_file() and p.name.startswith(incomplete)]
    except OSError:
        return []
    return [p.name for p in sorted(runs, key=lambda p: p.name.rsplit("-", 3)[-3:-1], reverse=True)]


def _profile_hosts(name: str) -> list[str]:
    """The ``host:`` entries of a profile file (hosts and spares), read without validating it."""
    from ..profiles.loader import find_profile

    try:
        text = find_profile(name).read_text()
    except Exception:  # noqa: BLE001 - an unknown profile completes nothing
        return []
    return list(dict.fromkeys(_HOST.findall(text)))


def _words() -> list[str]:
    """The command line being completed, as the shell hands it over (bash: ``COMP_WORDS``; zsh, fish
    and PowerShell: ``_TYPER_COMPLETE_ARGS``). click's own parse of it is empty of everything before a
    half-typed option, so the words are read here."""
    line = os.environ.get("COMP_WORDS") or os.environ.get("_TYPER_COMPLETE_ARGS") or ""
    try:
        return shlex.split(line)
    except ValueError:
        return line.split()


def _given(flags: tuple[str, ...]) -> Any:
    """An option's value on the command line being completed."""
    words = _words()
    return next((words[i + 1] for i, word in enumerate(words[:-1]) if word in flags), None)


def hosts(ctx: typer.Context, incomplete: str) -> list[str]:
    """The hosts of the profile given on the command line (``-p``), or of the run named on it."""
    profile = ctx.params.get("profile") or _given(("-p", "--profile"))
    found = _profile_hosts(profile) if profile else []
    if not found:
        plan = _plan()
        found = [str(node.get("host")) for node in plan.get("nodes") or ()] if plan else []
    return [host for host in found if host.startswith(incomplete)]


def _plan() -> dict[str, Any]:
    """plan.json of the run named on the command line (else the newest run)."""
    known = run_ids("")
    named = [run for word in _words()[2:] if word and not word.startswith("-") for run in known if run.startswith(word)]
    chosen = named[0] if named else (known[0] if known else None)
    if chosen is None:
        return {}
    try:
        return json.loads((_runs_dir() / chosen / "plan.json").read_text())
    except (OSError, ValueError):
        return {}


def ranks() -> list[str]:
    """The global ranks of the run named on the command line (else the newest run)."""
    world = _plan().get("world_size")
    return [str(r) for r in range(int(world))] if isinstance(world, int) else []


def profile_completion(ctx: typer.Context, incomplete: str) -> list[str]:
    return profile_names(incomplete)


def run_completion(ctx: typer.Context, incomplete: str) -> list[str]:
    return run_ids(incomplete)


def rank_completion(ctx: typer.Context, incomplete: str) -> list[str]:
    return [r for r in ranks() if r.startswith(incomplete)]
