"""The ``fsdpctl`` application: registers the commands and maps errors to one line and an exit code."""

from __future__ import annotations

import os
import sys

import typer

from .. import __version__
from ..errors import FsdpctlError, PreflightError
from . import (
    dashboard,
    doctor,
    env,
    estimate,
    fetch,
    hosts,
    init,
    launch,
    logs,
    notify,
    profile,
    profiles,
    render,
    report,
    stacks,
    status,
    submit,
    top,
)

app = typer.Typer(
    name="fsdpctl",
    help="Launch FSDP/FSDP2 training on many nodes over SSH or Slurm, checked before it starts.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"fsdpctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(  # noqa: B008 - Typer's declaration style
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Launch FSDP/FSDP2 training on many nodes over SSH or Slurm, checked before it starts."""


app.command(name="init")(init.init)
app.command(name="doctor")(doctor.doctor)
app.command(name="estimate")(estimate.estimate)
app.command(name="launch")(launch.launch)
app.command(name="submit")(submit.submit)
app.command(name="logs")(logs.logs)
app.command(name="status")(status.status)
app.command(name="top")(top.top)
app.command(name="dashboard")(dashboard.dashboard)
app.command(name="report")(report.report)
app.command(name="stop")(status.stop)
app.command(name="stacks")(stacks.stacks)
app.command(name="profile")(profile.profile)
app.command(name="fetch")(fetch.fetch)
app.command(name="runs")(status.runs)
app.command(name="render")(render.render)
app.command(name="profiles")(profiles.profiles)
app.command(name="hosts")(hosts.hosts)
app.command(name="notify")(notify.notify)
app.command(name="env")(env.env)


def report_error(exc: FsdpctlError) -> None:
    """Print an error as one line (plus its hint) on stderr; a failed preflight's report first."""
    if isinstance(exc, PreflightError):
        from .doctor_table import print_report

        print_report(exc.report)
    err = typer.style("error:", fg=typer.colors.RED, bold=True)
    typer.echo(f"{err} {exc.message}", err=True)
    if exc.hint:
        typer.echo(f"  hint: {exc.hint}", err=True)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the app; an FsdpctlError is one line, never a traceback."""
    # Everything fsdpctl writes (run directories, records, logs; Slurm jobs inherit it too) is the
    # user's alone: runs hold code, outputs and what the ranks print.
    os.umask(0o077)
    try:
        app(args=argv, prog_name="fsdpctl")
    except FsdpctlError as exc:
        if os.environ.get("FSDPCTL_DEBUG") == "1":
            raise
        report_error(exc)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
