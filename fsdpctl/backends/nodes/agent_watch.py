"""Step 5 of the node agent (``agent``): watching over a foreground run's node for its launcher.

Sent to the node after the agent's own source (``commands.agent_source``): the protocol's words and
``end_run`` come from there. Imported on the launcher's side only by the tests.
"""

import collections
import os
import select
import signal
import time

WRITE_BYTES = 64 << 10
"""Frames joined into one write at the most (a control message waits behind no more than this)."""
SIDE_WITH_LOG_SECONDS = 0.1
"""The side files are read with the log's new lines at most this often (a log that never stops
does not have them read at every turn)."""
QUIET_POLL_SECONDS = 0.2
"""How long the watch waits when nothing happens (its log's write or a new file wakes it sooner)."""
WAKE_PAUSE_SECONDS = 0.01
"""The pause after a wakeup: a log written to without a break wakes the watch 100 times a second at
most (it reads all that came at each turn)."""
IN_MODIFY, IN_MOVED_TO, IN_CREATE = 0x2, 0x80, 0x100
"""inotify's events: a file written, moved in, created (``<linux/inotify.h>``)."""

try:  # on the node this file follows the agent's source, which defines these
    from .agent import (
        ALIVE,
        EXIT,
        FAIL,
        GRACE_SECONDS,
        HALT,
        KILL,
        LINE,
        ORPHAN_GRACE_SECONDS,
        OUT_LIMIT,
        PEER_FAILED_GRACE_SECONDS,
        SIDE_LIMIT,
        SIDE_POLL_SECONDS,
        STOP,
        STOPPED,
        end_run,
        heartbeat_seconds,
    )
except ImportError:
    pass


class Watch:
    """Step 5: the node's log and end to the launcher, heartbeats both ways, and no run left behind.

    The log goes out as frames of its bytes, read from the file only while less than ``OUT_LIMIT``
    waits for the launcher: a launcher that reads slower than the ranks print gets every byte, late
    (the file on disk holds the rest meanwhile). ``!alive``, ``!stopped`` and ``!exit`` go ahead of
    log data that waits (never inside a frame): a launcher far behind a flood still learns at once
    that a node ended, and fails fast. After ``!exit`` the rest of the log follows, then the agent
    closes its output: the launcher's end of the log."""

    def __init__(self, run_id, rank, node_timeout, inp, attempt=None, cleanup=None, side=None,
                 stop=(None, GRACE_SECONDS)):
        self.run_id, self.rank, self.timeout, self.inp = run_id, rank, node_timeout, inp
        self.attempt, self.cleanup = attempt, cleanup
        self.stop_signal, self.stop_grace = stop  # what the launcher's stop gives the ranks first, and for how long
        self.side = side  # the side files (SideFiles), or None
        self.side_at = 0.0  # when the side files were last read
        self.log_came = False  # the last pump_log queued something
        self.control = []  # messages that go before any log data still waiting
        self.data = collections.deque()  # (frame, is a side file's) of log and side data
        self.queued = 0  # bytes of log frames in ``data``
        self.side_queued = 0  # bytes of side frames in ``data``
        self.current = memoryview(b"")  # what is being written now: one whole message or frame
        self.log = None
        self.last_heard = time.time()
        self.interval = heartbeat_seconds(node_timeout)
        self.next_alive = 0.0
        self.ending = None  # why this agent is ending the run itself
        self.ended_at = None
        self.launcher_gone = False
        self.wakeup = None  # a RunDirWakeup: readable when the node's log is written or its end appears
        self.log_followed = False  # the wakeup watches the log's writes (once the log exists)

    def say(self, text):
        self.control.append(("%s\n" % text).encode())

    def pending(self):
        return bool(self.current) or bool(self.control) or bool(self.data)

    def pump_log(self):
        """Read what the log has, while little waits for the launcher; True when held back."""
        if self.log is None:
            try:
                self.log = open("node%d.log" % self.rank, "rb")  # noqa: SIM115 - read as it grows, until exit
            except OSError:
                return False
        self.log_came = False
        while self.queued < OUT_LIMIT:
            chunk = self.log.read(1 << 16)
            if not chunk:
                return False
            self.log_came = True
            frame = ("%s%d\n" % (LINE, len(chunk))).encode() + chunk
            self.data.append((frame, False))
            self.queued += len(frame)
        return True

    def pump_side(self, now, ended):
        """Queue what the side files gained (every poll interval, and with the log's new lines, at
        most every ``SIDE_WITH_LOG_SECONDS``: a program writes a step's row as it prints the step's line,
        and both then leave in one write, one SSH packet for the launcher instead of two; at each turn
        once the node has ended, until they have nothing more); True when something was queued."""
        since = now - self.side_at
        due = since >= SIDE_POLL_SECONDS or (self.log_came and since >= SIDE_WITH_LOG_SECONDS)
        if self.side is None or (not ended and not due):
            return False
        self.side_at = now
        room = SIDE_LIMIT - self.side_queued
        if room <= 0:
            return False
        frames = self.side.poll(room)
        for frame in frames:
            self.data.append((frame, True))
            self.side_queued += len(frame)
        return bool(frames)

    def end(self, why, grace=GRACE_SECONDS, first=None):
        if self.ending is None:
            self.ending = why
            left = end_run(self.run_id, grace, self.rank, self.attempt, self.cleanup, first)
            self.ended_at = time.time()
            self.say("%s %s%s" % (STOPPED, why, " left: %s" % left if left else ""))

    def write(self):
        """Write what the launcher takes now: control messages first, between whole frames."""
        while True:
            if not self.current:
                if self.control:
                    self.current = memoryview(self.control.pop(0))
                elif self.data:
                    # Frames waiting go out in one write (up to WRITE_BYTES): one SSH packet for the
                    # launcher to read instead of one per frame, at any number of nodes.
                    frames = []
                    size = 0
                    while self.data and (not frames or size + len(self.data[0][0]) <= WRITE_BYTES):
                        frame, side = self.data.popleft()
                        if side:
                            self.side_queued -= len(frame)
                        else:
                            self.queued -= len(frame)
                        frames.append(frame)
                        size += len(frame)
                    self.current = memoryview(b"".join(frames))
                else:
                    return
            try:
                written = os.write(1, self.current)
            except BlockingIOError:
                return
            except OSError:
                self.launcher_gone = True
                self.end("the launcher is gone", ORPHAN_GRACE_SECONDS)
                return
            self.current = self.current[written:]
            if self.current:
                return  # the pipe is full: select says when it takes more

    def listen(self, wait, files=True):
        """Wait up to ``wait`` for the launcher's words, room to write, or (``files``) the wakeup: a
        line logged after a quiet spell, or the node's exit file appearing, goes out at once."""
        want_write = [1] if self.pending() and not self.launcher_gone else []
        wakeup = [self.wakeup.fd] if files and self.wakeup is not None else []
        readable, writable, _ = select.select([self.inp.fd, *wakeup], want_write, [], wait)
        if wakeup and wakeup[0] in readable:
            try:
                while os.read(wakeup[0], 65536):  # the events say only that something changed
                    pass
            except OSError:  # drained (EAGAIN)
                pass
            time.sleep(WAKE_PAUSE_SECONDS)
        if self.inp.fd in readable:
            data = self.inp.read(4096)
            if not data:
                self.launcher_gone = True  # it died, or its connection closed: nobody will stop the run
                self.end("the launcher is gone", ORPHAN_GRACE_SECONDS)
            self.last_heard = time.time()
            for word in data.decode("utf-8", "replace").split():
                if word == STOP:  # the ranks get the profile's stop signal and its grace to save and exit
                    self.end("asked by the launcher", self.stop_grace, self.stop_signal)
                elif word in (HALT, KILL, FAIL):
                    grace = {HALT: PEER_FAILED_GRACE_SECONDS, FAIL: PEER_FAILED_GRACE_SECONDS, KILL: 0.0}[word]
                    self.end("asked by the launcher" if word != FAIL else "another node failed", grace)
        if writable:
            self.write()

    def run(self):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # sshd hangs up on a launcher that died: we stay to clean up
        os.set_blocking(1, False)  # never block on a launcher that stopped reading
        self.wakeup = run_dir_wakeup()
        try:
            return self._watch()
        finally:
            if self.wakeup is not None:
                self.wakeup.close()

    def _watch(self):
        exit_file = "node%d.exit" % self.rank
        code = None
        while True:
            if self.wakeup is not None and not self.log_followed:
                self.log_followed = self.wakeup.follow("node%d.log" % self.rank)
            if code is None and os.path.exists(exit_file):
                with open(exit_file) as handle:  # written after the log's last byte
                    code = handle.read().strip() or "255"
                self.say("%s %s" % (EXIT, code))
            held_back = self.pump_log()
            now = time.time()
            side_more = self.pump_side(now, code is not None)
            if code is not None and not held_back and not side_more and not self.pending():
                return 0  # the whole log is out, and what the side files gained
            if code is not None and (self.launcher_gone or now - self.last_heard > self.timeout):
                return 0  # nobody reads the rest; the node's log file holds it all
            if now >= self.next_alive:
                self.say(ALIVE)
                self.next_alive = now + self.interval
            if now - self.last_heard > self.timeout and not self.launcher_gone:
                self.end("nothing heard from the launcher for %.0f s" % self.timeout, ORPHAN_GRACE_SECONDS)
            if self.ended_at is not None and code is None and now - self.ended_at > 15.0:
                return 1  # the run is ended; its wrapper left no exit file (it was killed too)
            # Held back (the launcher reads slower than the node logs): the log's writes do not wake it.
            self.listen(0.0 if held_back and not self.pending() else QUIET_POLL_SECONDS, files=not held_back)


class RunDirWakeup:
    """A descriptor (``fd``) readable once a file is created or moved into the run directory (the
    current one: the node's exit file appears so), or a file ``follow`` names is written (the node's
    log): Linux's inotify, called through the C library (the agent uses the standard library only).
    Other files' writes do not wake it: nodes sharing a run directory on one machine, and the ranks'
    own rows, would wake every agent at every line."""

    def __init__(self):
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError("inotify_init1 failed")
        if self.libc.inotify_add_watch(self.fd, b".", IN_CREATE | IN_MOVED_TO) < 0:
            self.close()
            raise OSError("inotify_add_watch failed")

    def follow(self, name):
        """Also wake when ``name`` is written; False while there is no such file."""
        return self.libc.inotify_add_watch(self.fd, name.encode(), IN_MODIFY) >= 0

    def close(self):
        os.close(self.fd)


def run_dir_wakeup():
    """The run directory's ``RunDirWakeup``; None where there is none (no ctypes, a C library without
    inotify, the per-user limit of instances reached): the watch then polls every ``QUIET_POLL_SECONDS``."""
    try:
        return RunDirWakeup()
    except (ImportError, OSError, AttributeError):
        return None


def side_files(specs):
    """The side files' reader, from the package shipped with the run (None: none asked, or a run
    directory without it)."""
    import sys

    if not specs:
        return None
    sys.path.insert(0, os.path.abspath("pkg"))
    try:
        from fsdpctl.node.side_files import SideFiles
    except ImportError:
        return None
    return SideFiles(specs)
