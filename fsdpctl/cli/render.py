"""``fsdpctl render``: write the plan and the scripts of a profile to a folder, to read or run by hand."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from . import common, jobopts


def render(
    command: Optional[list[str]] = jobopts.CommandArg,
    profile: Optional[str] = common.JobProfileOpt,
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Folder to write into (default: ./rendered/<run id>)."
    ),
    slurm: bool = typer.Option(False, "--slurm", help="Render the Slurm batch script instead of node scripts."),
    job: Optional[str] = jobopts.JobOpt,
    code: Optional[Path] = jobopts.CodeOpt,
    no_code: bool = jobopts.NoCodeOpt,
    chdir: Optional[str] = jobopts.ChdirOpt,
    env: Optional[list[str]] = jobopts.EnvOpt,
    requirements: Optional[Path] = jobopts.RequirementsOpt,
    debug: bool = common.DebugOpt,
) -> None:
    """Write plan.json and every rendered script of PROFILE (for your program after --, or the bundled
    workload) into a folder; print their paths."""
    from ..runs.paths import write_json_atomic

    prepared = jobopts.prepare(profile=profile, for_slurm=slurm, workload={}, debug=debug,
                               flags=jobopts.job_flags(command, job, code, no_code, chdir, None, env, requirements))
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
