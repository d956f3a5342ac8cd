"""How a supervisor learns what its nodes do: from the node agents it started, or by looking.

``AgentFeed``: the launcher of a foreground run keeps each node agent's session open: the node's log
lines, ``!alive`` every few seconds and its ``!exit`` arrive on it, and the launcher's heartbeats go
the other way. A node heard from neither for the node timeout is lost; its agent, hearing nothing
either, ends the run on its side. ``TailFeed``: any other process (``logs -f``) follows each node's
log with ``tail -F`` and polls its exit file over SSH.

Every thread here turns whatever goes wrong into that node's failure: none dies silently, and the
supervisor never waits on one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from ...errors import FsdpctlError, HostError
from ...node.side_files import FRAME as SIDE_FRAME
from ...node.side_files import FrameReader
from ...node.side_files import parse_header as parse_side_header
from ...rundir.state import NodeState
from ...shell import OUTPUT_MARK, after_mark, marked
from ..transport import Stream
from .agent import (
    ALIVE,
    EXIT,
    FAIL,
    HALT,
    HEARTBEAT,
    KILL,
    LINE,
    PEER_FAILED_GRACE_SECONDS,
    STOP,
    STOPPED,
    heartbeat_seconds,
)
from .commands import (
    Answer,
    Data,
    Exited,
    Gone,
    Lost,
    Message,
    Note,
    Running,
    SideData,
    SideEnded,
    StreamEnded,
    follow_command,
    parse_poll,
    poll_command,
)
from .runs import COMMAND_TIMEOUT, NodeRun, stop_run

__all__ = ["AgentFeed", "Answer", "Data", "Exited", "Feed", "Gone", "Listener", "Lost", "Message", "Note",
           "Running", "SideData", "SideEnded", "StreamEnded", "TailFeed", "heartbeat_seconds"]
POLL_SECONDS = 2.0
# While a node's log stream is open it says when the node ends; polls (an SSH command each, with the
# login shell's rc files, on nodes busy starting torch) are then only a safety net.
SAFETY_POLL_SECONDS = 10.0
STOP_SECONDS = 8.0
"""How long, beyond its grace period, a follower from outside waits for a stop it sent to be done."""
MIN_POLL_SILENCE = 20.0
"""The shortest silence (no log bytes, no poll answered) a follower from outside takes a node lost after."""


class Listener(Protocol):
    """What a feed needs of whoever follows the run (the supervisor): the nodes, where the run lives
    on them, the grace period, whether following has finished, and where answers go."""

    runs: list[NodeRun]
    run_dir: str
    run_id: str
    container_runtime: str | None
    grace: float
    """Seconds an orderly stop waits for the ranks to exit after ``stop_signal`` (the profile's ``stop_grace``)."""
    stop_signal: str
    """The signal's name an orderly stop gives the ranks first (the profile's ``stop_signal``)."""
    finished: threading.Event

    def put(self, run: NodeRun, message: Message) -> None:
        """Something about the node: a note, the end of its stream, or how its script stands."""

    def put_data(self, run: NodeRun, chunk: bytes) -> None:
        """Bytes of the node's log, in order (waits for room)."""


class Feed(Protocol):
    quiet_seconds: float
    """How long a node whose script ended may stay silent before its stream counts as done."""

    def start(self, sup: Listener) -> None:
        """Begin delivering lines and answers to ``sup.put``."""

    def ended_stream(self, sup: Listener, run: NodeRun) -> None:
        """A running node's stream ended: find out how it stands."""

    def check(self, sup: Listener) -> list[tuple[NodeRun, Answer]]:
        """Answers found by looking now (a node silent for too long)."""

    def stop(self, sup: Listener, runs: Sequence[NodeRun], hurry: bool, peer_failed: bool = False,
             save: bool = False) -> None:
        """End these nodes' processes: TERM, a grace period, KILL (``hurry``: KILL now; ``peer_failed``:
        another node failed, a short grace; ``save``: an orderly stop, the ranks get the stop signal
        first and ``sup.grace`` to exit by themselves)."""

    def close(self) -> None:
        """Release what the feed holds."""


def silent_for(silent: float, bound: str) -> Lost:
    """A node lost to silence: since when, and the bound it passed."""
    since = time.strftime("%H:%M:%S", time.localtime(time.time() - silent))
    return Lost(f"nothing heard from it since {since} ({silent:.0f} s; {bound})")


def _guarded(sup: Listener, run: NodeRun, body) -> None:
    """Run a feed thread's body; whatever it raises becomes that node's loss, in one line."""
    try:
        body()
    except Exception as exc:  # noqa: BLE001 - a monitoring thread must never die silently
        sup.put(run, Lost(f"{type(exc).__name__}: {exc}"))
        sup.put(run, StreamEnded())


class AgentFeed:
    """The node agents of a run this process started."""

    def __init__(self, node_timeout: float):
        self.node_timeout = node_timeout
        # An agent whose node ended says "alive" until the rest of its log is out: heard from while it sends.
        self.quiet_seconds = 2 * heartbeat_seconds(node_timeout)
        self.runs: list[NodeRun] = []

    def start(self, sup: Listener) -> None:
        self.runs = list(sup.runs)
        now = time.monotonic()
        for run in self.runs:
            run.last_heard = now
            threading.Thread(target=_guarded, args=(sup, run, lambda run=run: self._watch(sup, run)),
                             daemon=True).start()
        threading.Thread(target=self._heartbeats, args=(sup,), daemon=True).start()

    def _watch(self, sup: Listener, run: NodeRun) -> None:
        session, ended = run.session, False
        assert session is not None
        frame = LINE.encode()
        while not sup.finished.is_set():
            try:
                header = session.read_line_bytes(1.0)
            except HostError:  # nothing for a second: liveness is check()'s business
                continue
            if not header:
                if not ended:
                    sup.put(run, Lost("its agent's connection closed before the node ended"))
                sup.put(run, StreamEnded())
                return
            run.last_heard = time.monotonic()
            if header.startswith(frame) and header[1:-1].isdigit():
                data = self._frame(sup, session, int(header[1:-1]))
                if data is None:
                    return
                sup.put_data(run, data)
                continue
            side = parse_side_header(header) if header.startswith(SIDE_FRAME.encode()) else None
            if side is not None:
                index, inode, offset, size = side
                data = self._frame(sup, session, size)
                if data is None:
                    return
                sup.put(run, SideData(index, inode, offset, data))
                continue
            line = header.decode("utf-8", "replace").rstrip("\n")
            answer = parse_poll(line[1:]) if line.startswith(EXIT + " ") else None
            if isinstance(answer, Exited):
                ended = True
                sup.put(run, answer)
            elif line.startswith(STOPPED + " "):
                sup.put(run, Note(f"fsdpctl: the node ended its processes: {line[len(STOPPED) + 1:]}"))
            elif line != ALIVE:
                sup.put(run, Note(line))  # not the protocol's: show it rather than lose it

    @staticmethod
    def _frame(sup: Listener, session, size: int) -> bytes | None:
        """A frame's bytes (they follow its header at once); None when following ends first."""
        while not sup.finished.is_set():
            try:
                return session.read_exactly(size, 1.0)
            except HostError:
                continue
        return None

    def _heartbeats(self, sup: Listener) -> None:
        every = heartbeat_seconds(self.node_timeout)
        while not sup.finished.wait(every):
            for run in self.runs:
                # A node that ended still sends the rest of its log: its agent, hearing nothing for the
                # node timeout, would take it that nobody reads it and stop sending.
                if (run.state == NodeState.RUNNING or run.streaming) and run.session is not None:
                    try:
                        run.session.send(f"{HEARTBEAT}\n".encode())
                    except (HostError, OSError):
                        pass  # a node that cannot be written to is found silent by check()

    def ended_stream(self, sup: Listener, run: NodeRun) -> None:
        return None  # the agent's stream carries the node's end; a stream without one was reported lost

    def check(self, sup: Listener) -> list[tuple[NodeRun, Answer]]:
        bound = f"the node timeout is {self.node_timeout:g} s"
        return [(run, silent_for(time.monotonic() - run.last_heard, bound)) for run in self.runs
                if run.state == NodeState.RUNNING and time.monotonic() - run.last_heard > self.node_timeout]

    def stop(self, sup: Listener, runs: Sequence[NodeRun], hurry: bool, peer_failed: bool = False,
             save: bool = False) -> None:
        word = KILL if hurry else FAIL if peer_failed else STOP if save else HALT
        for run in runs:
            if run.session is not None:
                try:
                    run.session.send(f"{word}\n".encode())
                except (HostError, OSError):
                    pass  # unreachable: its agent ends the run itself when it stops hearing from us

    def close(self) -> None:
        for run in self.runs:
            if run.session is not None:
                run.session.close()  # an agent whose input ends leaves nothing of the run behind


class TailFeed:
    """A run followed from outside: its nodes' logs with ``tail -F``, their exit files polled; with
    ``side`` (a collecting follower's: the command that sends a node's side files, None for a node
    with none), the node's metrics and GPU samples too. With ``node_timeout`` (a follower that acts
    for a detached run), a node heard from by neither its log, its side files nor a poll for that
    long (``MIN_POLL_SILENCE`` at least) is lost, as a foreground run's node is: a poll to a cut link
    waits minutes to fail."""

    quiet_seconds = 0.0  # tail -F ends with the node's wrapper: whatever comes after that comes at once

    def __init__(self, side: Callable[[NodeRun], str | None] | None = None,
                 start_at: Callable[[NodeRun], int] | None = None, node_timeout: float | None = None) -> None:
        self.runs: list[NodeRun] = []
        self.side = side
        self.start_at = start_at  # each node's log from this byte on (default: its start)
        self.side_streams: list[Stream] = []
        # A poll is a command of its own (a login shell on a node busy starting torch may take seconds
        # to answer), not an agent's heartbeat on an open session: it gets a floor.
        self.silence = max(node_timeout, MIN_POLL_SILENCE) if node_timeout else None
        self.answered: dict[int, float] = {}  # when each node last answered a poll
        self.stoppers: list[tuple[threading.Thread, float]] = []  # stops under way, and until when to wait for them
        # a node followed by its stream is polled once this quiet; a quiet one often enough to be
        # found silent only when it is
        self.poll_every = min(SAFETY_POLL_SECONDS, self.silence / 4) if self.silence else SAFETY_POLL_SECONDS

    def start(self, sup: Listener) -> None:
        self.runs = list(sup.runs)
        began = time.monotonic()
        for run in self.runs:
            self.answered[run.rank] = began
            threading.Thread(target=_guarded, args=(sup, run, lambda run=run: self._follow(sup, run)),
                             daemon=True).start()
            command = self.side(run) if self.side is not None else None
            if command is not None:
                threading.Thread(target=self._side_files, args=(sup, run, command), daemon=True).start()
            # Polls are SSH round trips: a thread per node, so printing never waits behind one, nor
            # does one node's poll behind another's to a cut link.
            threading.Thread(target=self._poller, args=(sup, run), daemon=True).start()

    def _follow(self, sup: Listener, run: NodeRun) -> None:
        try:
            start = self.start_at(run) if self.start_at is not None else 0
            stream = run.transport.stream(follow_command(sup.run_dir, run.rank, run.pid, start))
            for chunk in _after_mark(stream):
                sup.put_data(run, chunk)
            stream.close()
        except (HostError, OSError, EOFError):
            pass  # the poll decides whether the host is gone
        sup.put(run, StreamEnded())

    def _side_files(self, sup: Listener, run: NodeRun, command: str) -> None:
        """The node's side files as frames, until the node has ended and they are all out (what
        goes wrong here loses only the copies' newest bytes: the log's stream decides about the node)."""
        run.side_streaming = True
        try:
            stream = run.transport.stream(command)
            self.side_streams.append(stream)
            reader = FrameReader()
            for chunk in _after_mark(stream):
                for index, inode, offset, data in reader.feed(chunk):
                    sup.put(run, SideData(index, inode, offset, data))
            stream.close()
        except (HostError, OSError, EOFError):
            pass
        finally:
            sup.put(run, SideEnded())

    def _poller(self, sup: Listener, run: NodeRun) -> None:
        while not sup.finished.wait(min(POLL_SECONDS, self.poll_every)) and run.state == NodeState.RUNNING:
            if run.streaming and time.monotonic() - self._heard(run) < self.poll_every:
                continue
            answer = self.ask(sup, run)
            if not isinstance(answer, Lost):
                self.answered[run.rank] = time.monotonic()
            if not sup.finished.is_set():
                sup.put(run, answer)

    def _heard(self, run: NodeRun) -> float:
        return max(run.last_heard, self.answered.get(run.rank, 0.0))

    def ask(self, sup: Listener, run: NodeRun) -> Answer:
        """The node's own word on its script (Lost when it does not answer)."""
        try:
            _, out, _ = run.transport.run(marked(poll_command(sup.run_dir, run.rank, run.pid)),
                                          COMMAND_TIMEOUT)
        except (HostError, FsdpctlError, OSError) as exc:
            return Lost(str(exc))
        return parse_poll(after_mark(out))

    def ended_stream(self, sup: Listener, run: NodeRun) -> None:
        sup.put(run, self.ask(sup, run))  # its log ended: it has probably just exited

    def check(self, sup: Listener) -> list[tuple[NodeRun, Answer]]:
        if not self.silence:
            return []
        bound = f"its polls go unanswered after {self.silence:g} s"
        return [(run, silent_for(time.monotonic() - self._heard(run), bound)) for run in self.runs
                if run.state == NodeState.RUNNING and time.monotonic() - self._heard(run) > self.silence]

    def stop(self, sup: Listener, runs: Sequence[NodeRun], hurry: bool, peer_failed: bool = False,
             save: bool = False) -> None:
        save = save and not (hurry or peer_failed)
        grace = 0.0 if hurry else sup.grace if save else PEER_FAILED_GRACE_SECONDS
        # Beside the following, not in its way: a stop sent over a cut link waits minutes for SSH to
        # give up, while the nodes' ends (and the cut node's silence) come in through the polls.
        stopper = threading.Thread(target=stop_run, args=(sup.run_id, [r.transport for r in runs], grace,
                                                          sup.container_runtime, sup.stop_signal if save else None,
                                                          sup.run_dir), daemon=True, name="fsdpctl-stop")
        stopper.start()
        self.stoppers.append((stopper, time.monotonic() + grace + STOP_SECONDS))

    def close(self) -> None:
        for stream in self.side_streams:
            try:
                stream.close()
            except (HostError, OSError):
                pass
        for stopper, until in self.stoppers:  # a reachable node's stop ends well within this
            stopper.join(max(0.0, until - time.monotonic()))


def _after_mark(stream: Stream) -> Iterator[bytes]:
    """A marked command's output after its mark (what the shell's rc files printed is dropped)."""
    mark = OUTPUT_MARK.encode() + b"\n"
    before: bytes | None = b""
    for chunk in stream.chunks():
        if before is not None:
            before += chunk
            at = before.find(mark)
            if at < 0:
                before = before[-len(mark):]
                continue
            chunk, before = before[at + len(mark):], None
        if chunk:
            yield chunk
