"""How fsdpctl acts on a node: write a file, start a detached process, signal it, run a command.

``LocalTransport`` is this machine (the ``local`` backend). Commands are argv lists, never shell
strings assembled here; the node script itself is the only shell, and it was rendered with every
value quoted.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from .errors import HostError


@dataclass
class NodeProcess:
    """A started node script: its process group and a stream of its merged stdout/stderr lines."""

    pid: int
    pgid: int
    lines: Iterator[str]
    wait: Callable[[], int]
    poll: Callable[[], int | None]


class Transport(Protocol):
    """What launching needs from a node."""

    host: str

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        """Create or replace a file on the node (parent folders included)."""

    def start(self, argv: list[str], cwd: str | None = None) -> NodeProcess:
        """Start ``argv`` detached in a new session; its output comes back line by line."""

    def signal_group(self, pgid: int, sig: int) -> bool:
        """Send ``sig`` to a process group; False when it no longer exists."""

    def run(self, command: str, timeout: float) -> tuple[int, str, str]:
        """Run one shell command line (quoted by fsdpctl.shell) and return (status, stdout, stderr)."""

    def close(self) -> None:
        """Release the connection, if any."""


def _lines(stream: IO[bytes]) -> Iterator[str]:
    for raw in iter(stream.readline, b""):
        yield raw.decode("utf-8", errors="replace").rstrip("\n")
    stream.close()


class LocalTransport:
    """This machine: files written directly, processes started with ``subprocess``."""

    host = "localhost"

    def __init__(self, cwd: Path | None = None):
        self.cwd = cwd or Path.cwd()

    def _path(self, path: str) -> Path:
        expanded = Path(path).expanduser()
        return expanded if expanded.is_absolute() else self.cwd / expanded

    def write_file(self, path: str, text: str, mode: int = 0o644) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, mode)
        os.replace(tmp, target)

    def start(self, argv: list[str], cwd: str | None = None) -> NodeProcess:
        # A new session: the node's whole process tree can be signalled as one group, and a
        # Ctrl-C in this terminal reaches only fsdpctl, which then tears the run down in order.
        process = subprocess.Popen(
            argv, cwd=self._path(cwd) if cwd else self.cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        assert process.stdout is not None
        return NodeProcess(pid=process.pid, pgid=process.pid, lines=_lines(process.stdout),
                           wait=process.wait, poll=process.poll)

    def signal_group(self, pgid: int, sig: int) -> bool:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return False
        return True

    def run(self, command: str, timeout: float) -> tuple[int, str, str]:
        # The same shell line an SSH server would run, so both transports behave alike.
        try:
            done = subprocess.run(["bash", "-c", command], cwd=self.cwd, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HostError(self.host, "timeout", f"command did not finish within {timeout:g} s",
                            "this machine may be overloaded; raise the timeout") from None
        return done.returncode, done.stdout, done.stderr

    def close(self) -> None:
        return None


TERMINATE = signal.SIGTERM
KILL = signal.SIGKILL
