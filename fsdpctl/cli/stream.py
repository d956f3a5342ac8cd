"""Showing a run's lines as they arrive: a coloured ``[host rN]`` prefix, progress, the final verdict."""

from __future__ import annotations

import re
import sys
import time

import typer

COLOURS = ["cyan", "magenta", "yellow", "green", "blue", "bright_cyan", "bright_magenta", "bright_yellow"]
_METRIC = re.compile(r"\bstep=(\d+)\s+loss=([0-9.]+)(?:.*?tok/s=([0-9.]+))?")
PROGRESS_SECONDS = 5.0


def prefix(node_rank: int, host: str, colour: bool = True) -> str:
    text = f"[{host} r{node_rank}]"
    return typer.style(text, fg=COLOURS[node_rank % len(COLOURS)]) if colour else text


class LinePrinter:
    """The sink for a run's lines: prints them, and a progress line on stderr every few seconds."""

    def __init__(self, total_steps: int | None = None, quiet_progress: bool = False):
        self.total = total_steps
        self.quiet = quiet_progress or not sys.stderr.isatty()
        self.colour = sys.stdout.isatty()  # no escape codes into pipes and files
        self.step: str | None = None
        self.loss: str | None = None
        self.rate: str | None = None
        self.shown = 0.0
        self.started = time.monotonic()

    def __call__(self, node_rank: int, host: str, line: str) -> None:
        metric = _METRIC.search(line)
        if metric:
            self.step, self.loss, self.rate = metric.group(1), metric.group(2), metric.group(3) or self.rate
            line = typer.style(line, bold=True) if self.colour else line
        # No flush per line: the supervisor flushes once per batch of lines (see flush).
        sys.stdout.write(f"{prefix(node_rank, host, self.colour)} {line}\n")
        if metric and not self.quiet and time.monotonic() - self.shown > PROGRESS_SECONDS:
            sys.stdout.flush()
            self.shown = time.monotonic()
            typer.echo(typer.style(f"fsdpctl: {self.progress()}", dim=True), err=True)

    def flush(self) -> None:
        sys.stdout.flush()

    def progress(self) -> str:
        total = f"/{self.total}" if self.total else ""
        rate = f"  tok/s {self.rate}" if self.rate else ""
        return f"step {self.step}{total}  loss {self.loss}{rate}  ({time.monotonic() - self.started:.0f} s)"

    def summary(self, run_id: str, outcome, run_dir) -> None:
        """The last word on a followed run (a backend ``Outcome``): success, interruption, the
        follower leaving, or the first failure in detail."""
        for note in outcome.notes:
            typer.echo(note, err=True)
        if outcome.state == "interrupted":
            typer.secho(f"fsdpctl: {outcome.message or f'run {run_id} interrupted; every process of it was stopped'}",
                        err=True, fg="yellow")
            return
        if outcome.message:
            colour = "yellow" if outcome.state == "detached" else "red" if outcome.exit_code else "green"
            typer.secho(f"fsdpctl: {outcome.message}", err=True, fg=colour)
            return
        if not outcome.first_failure:
            last = f"; last {self.progress()}" if self.step else ""
            typer.secho(f"fsdpctl: run {run_id} succeeded{last}; logs in {run_dir}", err=True, fg="green")
            return
        failure = outcome.first_failure
        if failure.get("hang"):
            typer.secho(f"fsdpctl: run {run_id} FAILED: hung: {failure['hang']}; every node was stopped "
                        f"(exit {outcome.exit_code})", err=True, fg="red")
            typer.echo(f"  stacks and flight-recorder dumps in {failure.get('hang_dir')}; logs in {run_dir}", err=True)
            return
        if failure.get("lost"):
            typer.secho(f"fsdpctl: run {run_id} FAILED: {failure['host']} (node {failure['node_rank']}) was lost: "
                        f"{failure['lost']}; every other node was stopped, and a lost node stops its own ranks "
                        f"once it hears nothing from this launcher", err=True, fg="red")
            typer.echo(f"  logs in {run_dir}", err=True)
            return
        who = f"rank {failure['rank']} (local rank {failure['local_rank']}) on " if failure.get("rank") is not None \
            else ""
        code = failure["exit_code"]
        code = 128 - code if isinstance(code, int) and code < 0 else code  # a signal, as a shell says it
        typer.secho(f"fsdpctl: run {run_id} FAILED: {who}{failure['host']} (node {failure['node_rank']}) exited "
                    f"{code} [{failure['state']}]; every other node was stopped", err=True, fg="red")
        if failure.get("error_file"):
            typer.echo(f"  error file (on {failure['host']}): {failure['error_file']}", err=True)
        if failure.get("error"):
            typer.echo(f"  error: {failure['error']}", err=True)
        typer.echo("  last lines:", err=True)
        for line in failure.get("last_lines", []):
            typer.echo(f"    {line}", err=True)
        typer.echo(f"  logs in {run_dir}", err=True)
