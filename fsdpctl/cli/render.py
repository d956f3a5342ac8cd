"""``fsdpctl render``: write the plan and the scripts of a profile to a folder, to read or run by hand."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from . import common


def render(
    profile: str = common.ProfileOpt,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Folder to write into (default: ./rendered/<run id>)."
    ),
    slurm: bool = typer.Option(False, "--slurm", help="Render the Slurm batch script instead of node scripts."),
    debug: bool = common.DebugOpt,
) -> None:
    """Write plan.json and every rendered script of PROFILE into a folder; print their paths."""
    from ..plan.render import render_all
    from ..plan.types import Overrides
    from ..runs.paths import write_json_atomic

    _, plan = common.build_plan(profile, Overrides(debug=debug), for_slurm=slurm)
    folder = out or Path("rendered") / plan.run_id
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "plan.json", plan.to_json())
    typer.echo(str(folder / "plan.json"))
    for name, text in render_all(plan).items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        os.chmod(path, 0o755)  # noqa: S103 - a script meant to be run
        typer.echo(str(path))
