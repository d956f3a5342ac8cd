"""Where an estimate runs: torch traces it, and the launcher never imports torch. Here when this
machine has torch (one trace process kept for every round of traces an estimate asks for), else on a
node of the profile (a process per round, over its transport, with the workload package sent along
as a zip: nothing of fsdpctl needs to be on the node). Either way a round's traces run side by side."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import FsdpctlError, UsageError
from ..shell import after_mark, command_line, marked
from ..workload.trace_process import TraceServer, answers

_BOOT = ("import io,sys,tempfile,zipfile;d=tempfile.mkdtemp(prefix='fsdpctl-estimate-');"
         "zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read())).extractall(d);sys.path.insert(0,d);"
         "from fsdpctl.workload.estimate import main;main(sys.argv[1:])")


def torch_here() -> bool:
    """This machine has torch (found, not imported: the launcher stays light)."""
    return importlib.util.find_spec("torch") is not None


class TracesHere:
    """Traces in a Python of this machine (this one): one trace server, started at the first round
    and kept until ``close``."""

    def __init__(self, extra_path: Sequence[str] = ()):
        self._path = [str(Path(__file__).resolve().parents[2]), *extra_path]
        self._server: TraceServer | None = None

    def run(self, requests: Sequence[dict[str, Any]], timeout: float) -> list[dict]:
        """Trace ``requests``, side by side; the answers in order."""
        if self._server is None:
            self._server = TraceServer(self._path)
        try:
            done = self._server.run(list(requests), timeout)
        except subprocess.TimeoutExpired:
            self._server = None  # ended by the timeout
            raise FsdpctlError(f"estimate: the trace took longer than {timeout:g} s",
                               "estimate fewer choices (--no-choices) or a smaller batch") from None
        if done.returncode != 0:
            self.close()
        return _results(done.returncode, done.stdout, done.stderr, "this machine")

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def workload_zip() -> bytes:
    """fsdpctl's workload package (and the package's light __init__), as the node imports it."""
    package = Path(__file__).resolve().parents[1]
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(package / "__init__.py", "fsdpctl/__init__.py")
        for source in sorted((package / "workload").glob("*.py")):
            archive.write(source, f"fsdpctl/workload/{source.name}")
    return data.getvalue()


def run_on_node(transport, python: str, requests: Sequence[dict[str, Any]], timeout: float) -> list[dict]:
    """Trace ``requests`` on a node, with its Python (one that has torch)."""
    command = marked(command_line(python, ["-c", _BOOT, json.dumps(list(requests))]))
    status, out, err = transport.run(command, timeout, stdin=workload_zip())
    return _results(status, after_mark(out), err, transport.host)


def _results(status: int, out: str, err: str, where: str) -> list[dict]:
    results = answers(out)
    if not results:
        last = (err.strip().splitlines() or [f"exit {status}"])[-1]
        raise FsdpctlError(f"estimate on {where}: the trace did not run ({last})",
                           "it needs torch (2.6 or newer) where it runs")
    refused = [r["refused"] for r in results if r.get("refused")]
    if refused:
        setting, _, rest = refused[0].partition(": ")
        raise UsageError(f"estimate --{setting.replace('_', '-')}: {rest}", "fix the setting named")
    return results
