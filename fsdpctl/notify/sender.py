"""Sending notices without holding up the run: one daemon thread per target, each with a bounded
queue, so a dead or slow target delays neither the run nor the other targets. ``put`` never blocks
(a full queue drops its oldest notice, counted); a failed send is tried again after 1 s, then 2 s;
a notice still not sent is given up and reported through ``on_given_up`` once per target (later
ones are only counted). ``close`` gives what is queued a few seconds at most (none to a target that
already gave a notice up), then lets go."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Optional

from .message import Message
from .targets import SendFailed, Target

CAPACITY = 64
"""Notices queued per target; past it the oldest is dropped (a run that floods them is a bug)."""
BACKOFF = (1.0, 2.0)
"""Seconds to wait after each failed try but the last: a notice is tried len(BACKOFF) + 1 times."""
CLOSE_SECONDS = 5.0
"""The most a run's end waits for its last notices."""


class Lane:
    """One target's queue and thread."""

    def __init__(self, target: Target, timeout: float, backoff: Sequence[float], capacity: int,
                 on_given_up: Callable[[str, str], None]):
        self.target, self.timeout, self.backoff = target, timeout, tuple(backoff)
        self.queue: queue.Queue[Optional[Message]] = queue.Queue(capacity)
        self.on_given_up = on_given_up
        self.sent = 0
        self.dropped = 0
        """Notices dropped from a full queue, and those not sent when the sender was closed."""
        self.given_up = 0
        self.noted = False
        self.abandon = threading.Event()
        """Set when ``close`` stops waiting: nothing more is tried."""
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"fsdpctl-notify {target.name}", daemon=True)
        self.thread.start()

    def put(self, notice: Optional[Message]) -> None:
        while True:
            try:
                self.queue.put_nowait(notice)
                return
            except queue.Full:
                try:
                    if self.queue.get_nowait() is not None:
                        self.dropped += 1
                except queue.Empty:
                    pass

    def _run(self) -> None:
        while True:
            notice = self.queue.get()
            if notice is None or self.abandon.is_set():
                return
            error = self._try(notice)
            if error is None:
                self.sent += 1
            else:
                self.given_up += 1
                self.note(f"notify: a {notice.event} notice to {self.target.name} was not sent after "
                          f"{len(self.backoff) + 1} tries: {error}")

    def _try(self, notice: Message) -> Optional[str]:
        """Send with retries; None once sent, else the last try's reason."""
        error = "not tried"
        for wait in (*self.backoff, None):
            try:
                self.target.send(notice, self.timeout)
                return None
            except SendFailed as exc:
                error = str(exc)
            except Exception as exc:  # noqa: BLE001 - whatever a target raises, the run must not hear of it
                error = f"{type(exc).__name__}: {exc}"
            if wait is None or self.abandon.wait(wait):
                break
        return error

    def note(self, text: str) -> None:
        """Report once per target; later failures are only counted."""
        with self.lock:
            if self.noted:
                return
            self.noted = True
        try:
            self.on_given_up(self.target.name, text)
        except Exception:  # noqa: BLE001, S110 - writing the note down failed: the run goes on regardless
            pass


class Sender:
    """Notices to ``targets``, each from its own thread (see the module). ``on_given_up(target,
    text)``: once per target whose notice could not be sent."""

    def __init__(self, targets: Sequence[Target], *, timeout: float = 10.0, on_given_up: Callable[[str, str], None],
                 backoff: Sequence[float] = BACKOFF, capacity: int = CAPACITY):
        self.lanes = [Lane(t, timeout, backoff, capacity, on_given_up) for t in targets]
        self.closed = False

    def put(self, notice: Message) -> None:
        """Queue ``notice`` for every target; never blocks."""
        if self.closed:
            return
        for lane in self.lanes:
            lane.put(notice)

    def close(self, within: float = CLOSE_SECONDS) -> None:
        """Let the queued notices go for at most ``within`` seconds in all (a target that already gave
        one up is not waited for), then let go of what is left (noted, once per target, as not sent)."""
        if self.closed:
            return
        self.closed = True
        for lane in self.lanes:
            lane.put(None)
        deadline = time.monotonic() + within
        for lane in self.lanes:
            if not lane.noted:  # a target that already gave a notice up is not waited for again
                lane.thread.join(max(0.0, deadline - time.monotonic()))
        for lane in self.lanes:
            if lane.thread.is_alive():
                lane.abandon.set()
                left = lane.queue.qsize()  # the one in flight stands where the closing None is counted
                lane.dropped += left
                lane.note(f"notify: {lane.target.name} did not answer before the run's end; {left} "
                          f"notice(s) to it not sent")

    @property
    def counts(self) -> dict[str, dict[str, int]]:
        """Per target: notices sent, given up after their tries, dropped."""
        return {lane.target.name: {"sent": lane.sent, "given_up": lane.given_up, "dropped": lane.dropped}
                for lane in self.lanes}
