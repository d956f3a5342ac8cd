"""How fsdpctl acts on a node: run a shell command line, or stream one's output line by line.

``LocalTransport`` is this machine (the ``local`` backend); ``ssh.SSHTransport`` has the same
methods. Command lines are built by ``fsdpctl.shell`` with every value quoted once; both
transports hand them to a shell on the node (bash here, the login shell over SSH).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Protocol

from ..errors import HostError


class Stream(Protocol):
    """A running command's output, line by line."""

    def lines(self) -> Iterator[str]:
        """Output lines (stdout and stderr together) until the command ends."""

    def close(self) -> None:
        """Stop reading (the command is ended if it still runs)."""


class Transport(Protocol):
    """What fsdpctl needs from a node."""

    host: str

    def run(self, command: str, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        """Run one shell command line; returns (status, stdout, stderr). Raises HostError."""

    def stream(self, command: str) -> Stream:
        """Start one shell command line and read its output as it comes. Raises HostError."""

    def close(self) -> None:
        """Release the connection, if any."""


def read_lines(stream: IO[bytes]) -> Iterator[str]:
    """Decode a byte stream into lines without their newline."""
    for raw in iter(stream.readline, b""):
        yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


class _LocalStream:
    def __init__(self, process: subprocess.Popen):
        self.process = process

    def lines(self) -> Iterator[str]:
        assert self.process.stdout is not None
        yield from read_lines(self.process.stdout)

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

    def close(self) -> None:
        return None
