"""How the CLI shows what the API reports: a run's lines with a coloured ``[host rN]`` prefix on
stdout, progress and every other event on stderr, and the final verdict."""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Optional

import typer

from ..api.events import (
    AttemptStarting,
    Event,
    Fetched,
    HostChecked,
    Notice,
    PreflightFailed,
    PreflightStarted,
    RunEnded,
    RunStarted,
)
from ..rundir.lines import LogLine
from ..rundir.state import Outcome, RunState

COLOURS = ["cyan", "magenta", "yellow", "green", "blue", "bright_cyan", "bright_magenta", "bright_yellow"]
_METRIC = re.compile(r"\bstep=(\d+)\s+loss=([0-9.]+)(?:.*?tok/s=([0-9.]+))?")
PROGRESS_SECONDS = 5.0
_LEVEL_COLOUR = {"info": None, "warning": "yellow", "error": "red", "success": "green"}


def prefix(line: LogLine, colour: bool = True) -> str:
    """``[host rN]`` for a rank's line (N its global rank), ``[host]`` for the node's own; coloured by node."""
    text = f"[{line.host} r{line.rank}]" if line.rank is not None else f"[{line.host}]"
    return typer.style(text, fg=COLOURS[line.node_rank % len(COLOURS)]) if colour else text


def say(text: str, colour: Optional[str] = None) -> None:
    """One ``fsdpctl:`` line on stderr."""
    typer.secho(f"fsdpctl: {text}", err=True, fg=colour)


class EventPrinter:
    """Renders the API's events on a terminal (or into pipes and files, without colours)."""

    def __init__(self, total_steps: Optional[int] = None, quiet_progress: bool = False, run_id_on_stdout: bool = False,
                 show_line=None):
        self.total = total_steps
        self.quiet = quiet_progress or not sys.stderr.isatty()
        self.colour = sys.stdout.isatty()  # no escape codes into pipes and files
        self.run_id_on_stdout = run_id_on_stdout  # `submit` prints the run id first, followed or not
        self.show_line = show_line  # a filter (``logs --rank``): True to show the line
        self.step: Optional[str] = None
        self.loss: Optional[str] = None
        self.rate: Optional[str] = None
        self.shown = 0.0
        self.started = time.monotonic()
        self.outcome: Optional[Outcome] = None
        self.announced = False
        self.prefixes: dict[tuple, str] = {}
        self.write = sys.stdout.write

    def __call__(self, event: Event) -> None:
        if isinstance(event, LogLine):
            self.line(event)
        elif isinstance(event, Notice):
            typer.secho(event.text if event.text.startswith(("fsdpctl:", "doctor:", " ")) else f"fsdpctl: {event.text}",
                        err=True, fg=_LEVEL_COLOUR[event.level])
        elif isinstance(event, HostChecked):
            from .doctor_table import progress

            progress(event.report)
        elif isinstance(event, PreflightStarted):
            say(f"{'re-check: ' if event.recheck else ''}preflight of {event.nodes} node(s)")
        elif isinstance(event, PreflightFailed):
            from .doctor_table import print_report

            print_report(event.report)
        elif isinstance(event, RunStarted):
            self.started_run(event)
        elif isinstance(event, AttemptStarting):
            where = f" from step {event.from_step}" if event.from_step is not None else ""
            say(f"attempt {event.attempt} of {event.last_attempt}{where} after {event.after}", "yellow")
        elif isinstance(event, RunEnded):
            self.outcome = event.outcome
            self.summary(event.run_id, event.outcome, event.run_dir)
        elif isinstance(event, Fetched):
            show_fetched(event.files)

    def started_run(self, event: RunStarted) -> None:
        if (event.detached or self.run_id_on_stdout) and not self.announced:
            typer.echo(event.run_id)  # stdout is data: the id, once, for scripts to capture
            self.announced = True
        if event.attempt > 1 and not event.detached:
            say(f"run {event.run_id} attempt {event.attempt} {event.how}")
            return
        say(f"run {event.run_id} {event.how}; run directory {event.run_dir}")
        if event.detached:
            say(f"detached; follow with `fsdpctl logs -f {event.run_id}`, end with `fsdpctl stop {event.run_id}`")

    def lines(self, batch: list[LogLine]) -> None:
        """A batch of lines: one write for all (the supervisor flushes after each batch)."""
        out = []
        for line in batch:
            if self.show_line is not None and not self.show_line(line):
                continue
            text = line.text
            if "step=" in text:  # a metrics line: progress, bold
                if out:
                    self.write("".join(out))
                    out = []
                self.line(line)
                continue
            key = (line.node_rank, line.host, line.rank)
            shown = self.prefixes.get(key)
            if shown is None:
                shown = self.prefixes[key] = prefix(line, self.colour) + " "
            out.append(shown + text + "\n")
        if out:
            self.write("".join(out))

    def line(self, line: LogLine) -> None:
        if self.show_line is not None and not self.show_line(line):
            return
        text = line.text
        metric = _METRIC.search(text) if "step=" in text else None
        if metric:
            self.step, self.loss, self.rate = metric.group(1), metric.group(2), metric.group(3) or self.rate
            text = typer.style(text, bold=True) if self.colour else text
        key = (line.node_rank, line.host, line.rank)
        shown = self.prefixes.get(key)
        if shown is None:
            shown = self.prefixes[key] = prefix(line, self.colour) + " "
        # No flush per line: the supervisor flushes once per batch of lines (see flush).
        self.write(shown + text + "\n")
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

    def summary(self, run_id: str, outcome: Outcome, run_dir: str) -> None:
        """The last word on a followed run: success, interruption, the follower leaving, or the first
        failure in detail."""
        self.flush()
        for note in outcome.notes:
            typer.echo(note, err=True)
        if outcome.state is RunState.INTERRUPTED:
            say(outcome.message or f"run {run_id} interrupted; every process of it was stopped", "yellow")
            return
        if outcome.message:
            colour = "yellow" if outcome.left else "red" if outcome.exit_code else "green"
            say(outcome.message, colour)
            return
        failure = outcome.first_failure
        if failure is None:
            last = f"; last {self.progress()}" if self.step else ""
            say(f"run {run_id} succeeded{last}; logs in {run_dir}", "green")
            return
        if failure.kind == "resize":
            say(f"run {run_id}: {failure.detail}; every node was stopped", "yellow")
            return
        if failure.kind == "hang":
            say(f"run {run_id} FAILED: {failure.headline()}; every node was stopped (exit {outcome.exit_code})", "red")
            typer.echo(f"  stacks and flight-recorder dumps in {failure.hang_dir}; logs in {run_dir}", err=True)
            return
        if failure.kind == "lost":
            say(f"run {run_id} FAILED: {failure.headline()}; every other node was stopped, and a lost node stops "
                f"its own ranks once it hears nothing from this launcher", "red")
            typer.echo(f"  logs in {run_dir}", err=True)
            return
        say(f"run {run_id} FAILED: {failure.headline()} [failed]; every other node was stopped", "red")
        if failure.in_shutdown:
            typer.echo("  its program had run to its end, exit handlers and all: the work is done; the crash came in "
                       "Python's own shutdown (torch's threads cause such crashes: pytorch/pytorch#117762)", err=True)
        if failure.error_file:
            typer.echo(f"  error file (on {failure.host}): {failure.error_file}", err=True)
        if failure.error:
            typer.echo(f"  error: {failure.error}", err=True)
        typer.echo("  last lines:", err=True)
        for text in failure.last_lines:
            typer.echo(f"    {text}", err=True)
        typer.echo(f"  logs in {run_dir}", err=True)


def show_fetched(fetched: dict[str, list[str]]) -> None:
    """One line per node: how many files came back and where they are, or that none did."""
    for where, files in fetched.items():
        if not files:
            say(f"fetched from {where}: nothing (no such path)")
            continue
        folder = os.path.commonpath(files) if len(files) > 1 else files[0]
        say(f"fetched from {where}: {len(files)} file(s) in {folder}")


def exit_code_of(printer: EventPrinter, default: int = 0) -> int:
    """The exit code of the run the printer saw end (``default`` when none did)."""
    return printer.outcome.exit_code if printer.outcome is not None else default
