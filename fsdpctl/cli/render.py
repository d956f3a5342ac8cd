"""``fsdpctl render``: write the plan and the scripts of a profile to a folder, to read or run by hand."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from .options import CLUSTER, JOB, WORKLOAD, Flags, with_options


@with_options(JOB, WORKLOAD, CLUSTER)
def render(
    flags: Flags,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder to write into (default: "
                                       "./rendered/<run id>)."),
    slurm: bool = typer.Option(False, "--slurm", help="Render the Slurm batch script instead of node scripts."),
) -> None:
    """Write plan.json and every rendered script of PROFILE (for your program after --, or the bundled
    workload) into a folder; print their paths."""
    import fsdpctl

    from ..rundir.paths import write_json_atomic
    from .show import print_warnings

    prepared = fsdpctl.prepare(flags.profile, options=flags.job_options(), slurm=slurm)
    print_warnings(prepared.warnings)
    plan = prepared.plan
    folder = out or Path("rendered") / plan.run_id
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "plan.json", plan.to_json())
    typer.echo(str(folder / "plan.json"))
    for name, text in prepared.scripts.items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        os.chmod(path, 0o755)  # noqa: S103 - a script meant to be run
        typer.echo(str(path))
