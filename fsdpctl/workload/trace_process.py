"""The estimate's trace in a Python process of its own, and its answers: the one place that starts
``python -m fsdpctl.workload.estimate`` and reads what it prints. Standard library only: the
launcher starts it on this machine (it never imports torch), and a rank of the workload starts it
beside its run (the trace needs a fake process group, and a rank has a real one)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

PREFIX = "fsdpctl.estimate"
"""What starts each answer line: ``fsdpctl.estimate: {json}``."""
MODULE = "fsdpctl.workload.estimate"
DONE = f"{PREFIX}-done"
"""What the serving trace process prints after the last answer to one line of requests."""


def _env(path: Sequence[str]) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]))


def trace_in_process(requests: Any, timeout: float, path: Sequence[str]) -> subprocess.CompletedProcess:
    """Trace ``requests`` (one configuration or a list) with this Python, ``path`` first on its
    PYTHONPATH (where fsdpctl is). Raises subprocess.TimeoutExpired."""
    return subprocess.run([sys.executable, "-m", MODULE, json.dumps(requests)], capture_output=True, text=True,
                          timeout=timeout, env=_env(path))


class TraceServer:
    """One trace process kept for every trace an estimate asks for (``--serve``): torch is imported
    once, however many rounds of traces follow one another. ``run`` answers a list of requests (traced
    side by side) within a deadline; ``close`` ends the process and the traces it forked."""

    def __init__(self, path: Sequence[str]):
        # A file, not a pipe: torch's warnings never block it. Closed by close().
        self._errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        # A session of its own: a timeout ends the forked traces with it (one signal to the group).
        self._process = subprocess.Popen([sys.executable, "-m", MODULE, "--serve"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._errors, text=True, env=_env(path),
                                         start_new_session=True)
        # Lines are handed over by a thread: a buffered pipe read may hold several, which a select on
        # the pipe would not see.
        self._lines: queue.Queue[Optional[str]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def run(self, requests: list[dict[str, Any]], timeout: float) -> subprocess.CompletedProcess:
        """The answers to ``requests`` as the one-shot process would print them (returncode 0 while
        the server lives). Raises subprocess.TimeoutExpired, after ending the server."""
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        try:
            self._process.stdin.write(json.dumps(requests) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, ValueError):  # it died, or was closed
            return self._ended(lines)
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise subprocess.TimeoutExpired(MODULE, timeout) from None
            if line is None:
                return self._ended(lines)
            if line.rstrip("\n") == DONE:
                return subprocess.CompletedProcess(self._process.args, 0, "".join(lines), "")
            lines.append(line)

    def _ended(self, lines: list[str]) -> subprocess.CompletedProcess:
        code = self._process.wait()
        self._errors.seek(0)
        return subprocess.CompletedProcess(self._process.args, code, "".join(lines), self._errors.read())

    def close(self) -> None:
        """Ends the process (and any trace it forked) and lets go of its pipes."""
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._process.wait()
        try:
            self._process.stdin.close()
        except OSError:
            pass
        self._errors.close()

    def __enter__(self) -> TraceServer:
        return self

    def __exit__(self, *exc: Optional[object]) -> None:
        self.close()


def answers(output: str) -> list[dict[str, Any]]:
    """Every answer the trace printed, in order."""
    head = f"{PREFIX}: "
    return [json.loads(line[len(head):]) for line in output.splitlines() if line.startswith(head)]
