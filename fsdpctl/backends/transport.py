"""How fsdpctl acts on a node: run a shell command line, stream one's output line by line, or hold
a conversation with one (a session: write to its stdin, read its stdout up to a marker).

``LocalTransport`` is this machine (the ``local`` backend); ``ssh.SSHTransport`` has the same
methods. Command lines are built by ``fsdpctl.shell`` with every value quoted once; both
transports hand them to a shell on the node (bash here, the login shell over SSH).
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Protocol

from ..errors import HostError

FAN_OUT = 1024
"""Nodes spoken to at once, at most (a thread each): every node of a 256-node run at once, since a
node probed or started in a later wave waits on the ones before it (and a probe's port window on
the master would close before the last wave's nodes tried it)."""


def fan_out(count: int) -> int:
    """Workers for ``count`` nodes at once."""
    return max(1, min(FAN_OUT, count))


def raise_open_files(nodes: int) -> None:
    """Make room for a run's descriptors (a connection, a log and side files' copies per node):
    the soft limit up to the hard one where ``nodes`` could reach it (a 256-node run passes the
    usual soft limit of 1024)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 256 + 8 * nodes
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        if target > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class Stream(Protocol):
    """A running command's output, line by line."""

    def lines(self) -> Iterator[str]:
        """Output lines (stdout and stderr together) until the command ends."""

    def chunks(self, idle_timeout: float | None = None) -> Iterator[bytes]:
        """Output as it comes, in pieces of any size, until the command ends; OSError (a timeout)
        after ``idle_timeout`` seconds without any."""

    def close(self) -> None:
        """Stop reading (the command is ended if it still runs)."""


class Session(Protocol):
    """A command that runs while fsdpctl talks to it."""

    def send(self, data: bytes) -> None:
        """Write to the command's stdin. Raises HostError."""

    def read_until(self, marker: str, timeout: float) -> str:
        """stdout up to and including the first line that holds ``marker``; what came before the end
        of output when it never comes. Raises HostError(cause="timeout")."""

    def read_line_bytes(self, timeout: float) -> bytes:
        """stdout's next line as bytes (b"" at the end). Raises HostError(cause="timeout")."""

    def read_exactly(self, count: int, timeout: float) -> bytes:
        """stdout's next ``count`` bytes (fewer only at the end). Raises HostError(cause="timeout")."""

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """Close stdin and wait for the end: (exit status, the rest of stdout, stderr). Raises HostError."""

    def close(self) -> None:
        """End the conversation (the command sees its stdin close)."""


class Transport(Protocol):
    """What fsdpctl needs from a node."""

    host: str

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        """Run one shell command line; returns (status, stdout, stderr). Raises HostError."""

    def stream(self, command: str) -> Stream:
        """Start one shell command line and read its output as it comes. Raises HostError."""

    def session(self, command: str) -> Session:
        """Start one shell command line to talk to. Raises HostError."""

    def close(self) -> None:
        """Release the connection, if any."""


def read_lines(stream: IO[bytes]) -> Iterator[str]:
    """Decode a byte stream into lines without their newline."""
    for raw in iter(stream.readline, b""):
        yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


class MarkerReader:
    """Reads a command's stdout up to marker lines, across reads that each get what time is left."""

    def __init__(self, host: str, recv: Callable[[float], bytes]):
        self.host, self.recv = host, recv  # recv(seconds) -> bytes, b"" at the end; TimeoutError when none came
        self.pending = b""
        self.ended = False

    def until(self, marker: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        wanted = marker.encode()
        while wanted not in self.pending and not self.ended:
            self._fill(deadline, timeout)
        at = self.pending.find(wanted)
        end = len(self.pending) if at < 0 else self.pending.find(b"\n", at) + 1 or len(self.pending)
        text, self.pending = self.pending[:end], self.pending[end:]
        return text.decode("utf-8", "replace")

    def _fill(self, deadline: float, timeout: float) -> None:
        """Receive once more (the end of output leaves ``ended`` set); HostError when nothing came in time."""
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            chunk = self.recv(left)
        except TimeoutError:
            raise HostError(self.host, "timeout", f"no answer within {timeout:g} s",
                            "the node may be overloaded or stuck; look at it") from None
        self.ended = not chunk
        self.pending += chunk

    def line_bytes(self, timeout: float) -> bytes:
        """The next line, newline included, as bytes; what is left at the end of output (b"" when
        nothing is). Raises HostError(cause="timeout")."""
        deadline = time.monotonic() + timeout
        while (at := self.pending.find(b"\n")) < 0 and not self.ended:
            self._fill(deadline, timeout)
        end = len(self.pending) if at < 0 else at + 1
        line, self.pending = self.pending[:end], self.pending[end:]
        return line

    def exactly(self, count: int, timeout: float) -> bytes:
        """The next ``count`` bytes (fewer only at the end of output). Raises HostError(cause="timeout")."""
        deadline = time.monotonic() + timeout
        while len(self.pending) < count and not self.ended:
            self._fill(deadline, timeout)
        data, self.pending = self.pending[:count], self.pending[count:]
        return data

    def rest(self, timeout: float) -> str:
        """Everything until the end of output."""
        deadline = time.monotonic() + timeout
        while not self.ended:
            self._fill(deadline, timeout)
        text, self.pending = self.pending, b""
        return text.decode("utf-8", "replace")


class ReadingSession:
    """A session's reading side, through its ``reader`` (a MarkerReader over its stdout)."""

    reader: MarkerReader

    def read_until(self, marker: str, timeout: float) -> str:
        return self.reader.until(marker, timeout)

    def read_line_bytes(self, timeout: float) -> bytes:
        return self.reader.line_bytes(timeout)

    def read_exactly(self, count: int, timeout: float) -> bytes:
        return self.reader.exactly(count, timeout)


class _LocalSession(ReadingSession):
    def __init__(self, host: str, process: subprocess.Popen):
        self.process = process
        self.stderr: list[bytes] = []
        assert process.stdout is not None and process.stderr is not None
        stderr = process.stderr
        self._drain = threading.Thread(target=lambda: self.stderr.extend(iter(lambda: stderr.read(65536), b"")),
                                       daemon=True)
        self._drain.start()
        self.reader = MarkerReader(host, self._recv)

    def _recv(self, seconds: float) -> bytes:
        fd = self.process.stdout.fileno()  # type: ignore[union-attr]
        ready, _, _ = select.select([fd], [], [], seconds)
        if not ready:
            raise TimeoutError
        return os.read(fd, 65536)

    def send(self, data: bytes) -> None:
        try:
            self.process.stdin.write(data)  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass  # the command has ended; read_until and finish say how

    def finish(self, timeout: float) -> tuple[int, str, str]:
        self._close_stdin()
        rest = self.reader.rest(timeout)
        try:
            status = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise HostError(self.reader.host, "timeout", f"command did not end within {timeout:g} s",
                            "this machine may be overloaded") from None
        self._drain.join(timeout)
        return status, rest, b"".join(self.stderr).decode("utf-8", "replace")

    def _close_stdin(self) -> None:
        try:
            self.process.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass

    def close(self) -> None:
        self._close_stdin()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _LocalStream:
    def __init__(self, process: subprocess.Popen):
        self.process = process

    def lines(self) -> Iterator[str]:
        assert self.process.stdout is not None
        yield from read_lines(self.process.stdout)

    def chunks(self, idle_timeout: float | None = None) -> Iterator[bytes]:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while True:
            if idle_timeout is not None and not select.select([fd], [], [], idle_timeout)[0]:
                raise TimeoutError(f"no output for {idle_timeout:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()


class LocalTransport:
    """This machine, through bash: the same shell lines an SSH server would run."""

    host = "localhost"

    def __init__(self, cwd: Path | None = None):
        self.cwd = cwd or Path.cwd()

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        try:
            done = subprocess.run(["bash", "-c", command], cwd=self.cwd, input=stdin or b"",
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HostError(self.host, "timeout", f"command did not finish within {timeout:g} s",
                            "this machine may be overloaded; raise the timeout") from None
        return (done.returncode, done.stdout.decode("utf-8", "replace"),
                done.stderr.decode("utf-8", "replace"))

    def stream(self, command: str) -> _LocalStream:
        return _LocalStream(subprocess.Popen(["bash", "-c", command], cwd=self.cwd, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT))

    def session(self, command: str) -> _LocalSession:
        return _LocalSession(self.host, subprocess.Popen(["bash", "-c", command], cwd=self.cwd,
                                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                         stderr=subprocess.PIPE))

    def close(self) -> None:
        return None
