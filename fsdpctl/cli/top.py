"""``fsdpctl top``: a run, live, on one screen (``top_view`` draws it), from ``Run.watch``'s snapshots:
it reads the run's directory here only, so watching costs the nodes nothing. ``q`` leaves the view;
the run goes on. Without a terminal (or with ``--once``) it prints snapshots as plain text; ``--json``
prints them as JSON lines. ``launch --top`` and ``submit --follow --top`` show it while they follow.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import sys
import threading
from collections.abc import Iterator
from typing import Any, Optional

import typer

from .complete import rank_completion, run_completion

KEY_WAIT = 0.1
"""How often keys are looked at while no snapshot comes."""
DRAW_GAP_SECONDS = 0.5


def top(
    run_id: Optional[str] = typer.Argument(None, autocompletion=run_completion,
                                           help="Run id (or a unique prefix); default: the newest run still "
                                           "going, else the newest."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot as text and leave."),
    as_json: bool = typer.Option(False, "--json", help="Print snapshots as JSON, one per line (with --once: one)."),
    rank: Optional[int] = typer.Option(None, "--rank", min=0, autocompletion=rank_completion,
                                       help="Show the log lines of this global rank only."),
    node: Optional[int] = typer.Option(None, "--node", min=0, help="Show the log lines of this node only."),
    interval: float = typer.Option(2.0, "--interval", min=0.2, help="Seconds between snapshots when nothing "
                                   "changes (a change shows at once)."),
) -> None:
    """A run as it goes, on one screen: progress and ETA, loss and tokens/s, every node and its GPUs
    (clocks, slowdowns, faults), each rank's compute time, the straggler and its cause, attempts and
    spares, the newest log lines. Keys: q quits (the run goes on), r rank, n node, a all."""
    from ..api.watching import run_to_watch

    with run_to_watch(run_id) as run:
        show(run, once=once, as_json=as_json, rank=rank, node=node, interval=interval)


def show(run: Any, *, once: bool = False, as_json: bool = False, rank: Optional[int] = None,
         node: Optional[int] = None, interval: float = 2.0, leave_when_over: bool = False) -> None:
    """Show ``run``: the full-screen view on a terminal, else text or JSON snapshots until it ends."""
    from .top_view import plain

    if as_json:
        for snap in run.watch(interval):
            typer.echo(json.dumps(snap.to_json()))
            if once:
                return
        return
    if once or not sys.stdout.isatty():
        # No terminal: one snapshot, or (as `top -b`) one every time something changed, until the end.
        for snap in run.watch(max(interval, 1.0)):
            typer.echo(plain(snap, rank=rank, node=node), nl=False)
            if once:
                return
            typer.echo("")
        return
    LiveScreen(run, rank=rank, node=node, interval=interval, leave_when_over=leave_when_over).show()


class LiveScreen:
    """The full-screen view: snapshots from a thread, keys from the terminal, redrawn on either."""

    def __init__(self, run: Any, *, rank: Optional[int], node: Optional[int], interval: float,
                 leave_when_over: bool):
        self.watched, self.rank, self.node, self.interval = run, rank, node, interval
        self.leave_when_over = leave_when_over
        self.snapshots: queue.Queue = queue.Queue(maxsize=4)
        self.stop = threading.Event()
        self.typing: Optional[str] = None  # "rank" or "node" while a number is typed
        self.typed = ""
        self.failed: list[BaseException] = []

    def _watch(self) -> None:
        try:
            # At most two screens a second: a new step still shows well within a second.
            for snap in self.watched.watch(self.interval, until_over=False, gap=DRAW_GAP_SECONDS):
                if self.stop.is_set():
                    return
                with contextlib.suppress(queue.Full):
                    while True:  # only the newest matters
                        try:
                            self.snapshots.get_nowait()
                        except queue.Empty:
                            break
                    self.snapshots.put_nowait(snap)
        except Exception as exc:  # noqa: BLE001 - shown by the main loop, not lost in a thread
            self.failed.append(exc)
            self.stop.set()

    def show(self) -> None:
        from rich.console import Console
        from rich.live import Live

        from .top_view import render

        console = Console()
        watcher = threading.Thread(target=self._watch, name="fsdpctl-top", daemon=True)
        watcher.start()
        snap = None
        with _cbreak(sys.stdin) as keys, Live(console=console, screen=True, auto_refresh=False) as live:
            while not self.stop.is_set():
                try:
                    snap = self.snapshots.get(timeout=KEY_WAIT)
                    changed = True
                except queue.Empty:
                    changed = False
                changed = self._keys(keys) or changed
                if snap is not None and changed:
                    width, height = console.size
                    live.update(render(snap, width, height, rank=self.rank, node=self.node,
                                       prompt=self._prompt()), refresh=True)
                if snap is not None and snap.over and self.leave_when_over:
                    break
        self.stop.set()
        if self.failed:
            raise self.failed[0]

    def _prompt(self) -> Optional[str]:
        if self.typing is None:
            return None
        return f" show the lines of {self.typing}: {self.typed}_  (Enter: show, Esc: cancel)"

    def _keys(self, fd: Optional[int]) -> bool:
        """Act on what was typed; True when the screen must be drawn again."""
        if fd is None or not select.select([fd], [], [], 0)[0]:
            return False
        data = os.read(fd, 64).decode("utf-8", "replace")
        for key in data:
            if self.typing is not None:
                if key.isdigit():
                    self.typed += key
                elif key in ("\r", "\n"):
                    number = int(self.typed) if self.typed else None
                    self.rank, self.node = (number, None) if self.typing == "rank" else (None, number)
                    self.typing = None
                elif key in ("\x1b",):
                    self.typing = None
                elif key in ("\x7f", "\b"):
                    self.typed = self.typed[:-1]
            elif key in ("q", "Q"):
                self.stop.set()
            elif key in ("r", "n"):
                self.typing, self.typed = ("rank" if key == "r" else "node"), ""
            elif key == "a":
                self.rank = self.node = None
        return True


@contextlib.contextmanager
def _cbreak(stream: Any) -> Iterator[Optional[int]]:
    """The terminal's keys one at a time (its settings restored after, however this ends); None when
    the input is no terminal (the view then only shows)."""
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):
        yield None
        return
    if not os.isatty(fd):
        yield None
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def watching(printer: Any, enabled: bool) -> Iterator[Any]:
    """The event handler for a command that starts a run: ``printer``, or with ``enabled`` (``--top``)
    one that shows the live view once the run has started; on the way out, the view is waited for
    (it leaves when the run is over, or on q). Without a terminal ``--top`` is said to do nothing."""
    if not enabled:
        yield printer
        return
    if not sys.stdout.isatty():
        from .events import say

        say("--top needs a terminal: the run's lines follow here instead", "yellow")
        yield printer
        return
    handler = TopWhileFollowing(printer)
    try:
        yield handler
    finally:
        handler.wait()


class TopWhileFollowing:
    """For ``launch --top`` / ``submit --follow --top``: the event handler that shows the live view
    once the run has started, holding back what would be printed meanwhile (the log lines are in the
    view and in the run's logs; other events are printed once the view is left), then passing
    everything on to ``printer``."""

    HELD = 500

    def __init__(self, printer: Any):
        self.printer = printer
        self.thread: Optional[threading.Thread] = None
        self.showing = threading.Event()
        self.held: list[Any] = []
        self.lock = threading.Lock()
        self.failed: list[BaseException] = []
        self.returned = threading.Event()  # the command's call has returned (the run ended, or was detached)

    def __call__(self, event: Any) -> None:
        from ..api.events import RunStarted
        from ..rundir.lines import LogLine

        if isinstance(event, RunStarted) and self.thread is None:
            self.printer(event)
            self._start(event)
            return
        with self.lock:
            if self.showing.is_set():
                if not isinstance(event, LogLine) and len(self.held) < self.HELD:
                    self.held.append(event)
                return
        self.printer(event)

    def lines(self, batch: list[Any]) -> None:
        if not self.showing.is_set():
            self.printer.lines(batch)

    def flush(self) -> None:
        if not self.showing.is_set():
            self.printer.flush()

    def _start(self, event: Any) -> None:
        from pathlib import Path

        import fsdpctl

        run = fsdpctl.get_run(event.run_id, runs_dir=Path(event.run_dir).parent)
        self.printer.finish()  # lines still folding are shown before the view takes the terminal
        self.showing.set()

        def body() -> None:
            try:
                show(run, leave_when_over=True)
            except Exception as exc:  # noqa: BLE001 - reported once the launch returns
                self.failed.append(exc)
            finally:
                self.leave()

        self.thread = threading.Thread(target=body, name="fsdpctl-top-view", daemon=True)
        self.thread.start()

    def leave(self) -> None:
        """The view is gone: print what was held back, and everything from now on."""
        with self.lock:
            self.showing.clear()
            held, self.held = self.held, []
        if not self.returned.is_set():  # q, before the run's end: its lines go on here
            from .events import say

            say("left the live view; the run goes on, its lines follow here")
        for event in held:
            self.printer(event)

    def wait(self) -> None:
        """Once the launch returns: let the view see the end, then print what it held back."""
        self.returned.set()
        if self.thread is not None:
            self.thread.join()
        if self.failed:
            from .events import say

            say(f"the live view failed: {self.failed[0]}", "yellow")
