"""How the CLI shows what the API reports: a run's lines with a coloured ``[host rN]`` prefix on
stdout, progress and every other event on stderr, and the final verdict."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Optional

import typer

from ..api.events import (
    AttemptStarting,
    EnvironmentProgress,
    Event,
    Fetched,
    HostChecked,
    Notice,
    PreflightFailed,
    PreflightStarted,
    RunEnded,
    RunStarted,
)
from ..rundir.folding import Folded, LineFolder, label
from ..rundir.lines import LogLine
from ..rundir.state import Outcome, RunState

COLOURS = ["cyan", "magenta", "yellow", "green", "blue", "bright_cyan", "bright_magenta", "bright_yellow"]
_METRIC = re.compile(r"\bstep=(\d+)\s+loss=([0-9.]+)(?:.*?tok/s=([0-9.]+))?")
PROGRESS_SECONDS = 5.0
_LEVEL_COLOUR = {"info": None, "warning": "yellow", "error": "red", "success": "green"}


def prefix(line: LogLine, colour: bool = True, inside: Optional[str] = None) -> str:
    """``[host rN]`` for a rank's line (N its global rank), ``[host]`` for the node's own, ``[inside]`` for
    a line several ranks said (``fsdpctl.rundir.folding.label``); coloured by node."""
    text = f"[{inside}]" if inside else f"[{line.host} r{line.rank}]" if line.rank is not None else f"[{line.host}]"
    return typer.style(text, fg=COLOURS[line.node_rank % len(COLOURS)]) if colour else text


def folder_if(dedup: bool, world: Optional[int] = None, by_lines: bool = False) -> Optional[LineFolder]:
    """A folder of the lines several ranks print alike, when ``dedup`` (``--dedup/--no-dedup``)."""
    if not dedup:
        return None
    return LineFolder.by_lines(world) if by_lines else LineFolder(world)


def say(text: str, colour: Optional[str] = None) -> None:
    """One ``fsdpctl:`` line on stderr."""
    typer.secho(f"fsdpctl: {text}", err=True, fg=colour)


class EventPrinter:
    """Renders the API's events on a terminal (or into pipes and files, without colours)."""

    def __init__(self, total_steps: Optional[int] = None, quiet_progress: bool = False, run_id_on_stdout: bool = False,
                 show_line=None, folder: Optional[LineFolder] = None):
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
        self.folder = folder  # the same line of several ranks shown once (None: every line as it came)
        self.lock = threading.Lock()  # the lines' thread and the folder's ticker write in turn
        self.ticking: Optional[threading.Thread] = None

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
            if self.folder is not None and event.world:
                self.folder.world = event.world
            self.started_run(event)
        elif isinstance(event, AttemptStarting):
            where = f" from step {event.from_step}" if event.from_step is not None else ""
            say(f"attempt {event.attempt} of {event.last_attempt}{where} after {event.after}", "yellow")
        elif isinstance(event, RunEnded):
            self.outcome = event.outcome
            self.summary(event.run_id, event.outcome, event.run_dir)
        elif isinstance(event, Fetched):
            show_fetched(event.files)
        elif isinstance(event, EnvironmentProgress):
            show_bytes(event.sent, event.total)

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
        wanted = batch if self.show_line is None else [line for line in batch if self.show_line(line)]
        if self.folder is not None and self.folder.world != 1:  # (one rank: nothing to fold)
            with self.lock:
                self._show_all(self.folder.add_all(wanted))
            self._tick()
            return
        self._show_lines([(line, None) for line in wanted])

    def line(self, line: LogLine) -> None:
        self.lines([line])

    def _show_all(self, ready: list[Folded]) -> None:
        self._show_lines([(f.line, label(f, self.folder.world) if len(f.ranks) > 1 else None) for f in ready])

    def _show_lines(self, shown: list[tuple[LogLine, Optional[str]]]) -> None:
        """Lines to show (each with the ranks that said it, where several did), in one write; a
        metrics line on its own (it may print progress)."""
        out = []
        for line, inside in shown:
            if "step=" in line.text:
                if out:
                    self.write("".join(out))
                    out = []
                self._show(line, inside)
                continue
            out.append(self._head(line, inside) + line.text + "\n")
        if out:
            self.write("".join(out))

    def _head(self, line: LogLine, inside: Optional[str]) -> str:
        """A line's prefix and its space: a one-rank line's kept per rank, a folded line's made anew."""
        if inside:
            return prefix(line, self.colour, inside) + " "
        key = (line.node_rank, line.host, line.rank)
        head = self.prefixes.get(key)
        if head is None:
            head = self.prefixes[key] = prefix(line, self.colour) + " "
        return head

    def _tick(self) -> None:
        """While lines wait for the other ranks' same line, show each once its window has passed."""
        if self.ticking is not None and self.ticking.is_alive():
            return

        def tick() -> None:
            while True:
                time.sleep(self.folder.window / 4)
                with self.lock:
                    ready = self.folder.ready()
                    self._show_all(ready)
                    waiting = self.folder.waiting()
                if ready:
                    sys.stdout.flush()
                if not waiting:
                    return

        if self.folder.waiting() and self.folder.timed:
            self.ticking = threading.Thread(target=tick, name="fsdpctl-log-folder", daemon=True)
            self.ticking.start()

    def finish(self) -> None:
        """Show every line still waiting for other ranks, then flush (the run ended, or its logs were read)."""
        if self.folder is not None:
            with self.lock:
                self._show_all(self.folder.drain())
        self.flush()

    def _show(self, line: LogLine, inside: Optional[str] = None) -> None:
        text = line.text
        metric = _METRIC.search(text) if "step=" in text else None
        if metric:
            self.step, self.loss, self.rate = metric.group(1), metric.group(2), metric.group(3) or self.rate
            text = typer.style(text, bold=True) if self.colour else text
        # No flush per line: the supervisor flushes once per batch of lines (see flush).
        self.write(self._head(line, inside) + text + "\n")
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
        self.finish()
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


def show_bytes(sent: int, total: int) -> None:
    """The wheels sent to the nodes so far, as a bar on stderr (redrawn in place on a terminal; at the
    end only, elsewhere)."""
    width = 30
    done = min(width, int(width * sent / total)) if total else width
    text = f"sending wheels [{'#' * done}{'.' * (width - done)}] {sent / 1e6:.0f}/{total / 1e6:.0f} MB"
    if sys.stderr.isatty():
        sys.stderr.write(f"\r{text}" + ("\n" if sent >= total else ""))
        sys.stderr.flush()
    elif sent >= total:
        say(text)


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
