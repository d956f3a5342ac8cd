"""The run's copy of its nodes' logs, made whole: what a live stream did not bring (a lost node, a
launcher killed mid-run, a detached run nobody followed) is read from the nodes and appended, so
``logs/node<R>.log`` here ends up equal to ``node<R>.log`` on the node; ``logs/merged.log`` is then
written again from those copies, node after node (a launcher killed between two writes may have
left it out of step with them). A node that does not answer is named, with where its whole log is.
A launcher that followed its run to the end records ``logs_complete`` and nothing is asked again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...errors import HostError
from ...plan.types import NodeSpec
from ...rundir.lines import LineSplitter, shown
from ...rundir.paths import private_dir
from ...rundir.record import Launcher, RunRecord
from ...rundir.rundir import RunDir
from ...shell import OUTPUT_MARK, marked, quote_path
from ..transport import Transport, fan_out

MISSING = "missing"
IDLE_SECONDS = 30.0
"""A node that sends nothing of its log for this long is given up (a cut link)."""


def launcher_record() -> Launcher:
    """Who streams a foreground run's logs into its directory (kept in run.json)."""
    return Launcher(host=socket.gethostname(), pid=os.getpid())


def streamed_now(record: RunRecord) -> bool:
    """A live launcher on this machine is still writing the run's logs here."""
    launcher = record.launcher
    if record.state.is_over or launcher is None or launcher.host != socket.gethostname() or not launcher.pid:
        return False
    try:
        os.kill(launcher.pid, 0)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """One completion at a time per run (two `fsdpctl logs` must not append the same bytes twice)."""
    fd = os.open(folder / ".complete.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _rest_command(run_dir: str, rank: int, offset: int) -> str:
    """The node log's size, then its bytes from ``offset`` on."""
    log = f"node{rank}.log"
    return marked(f"if cd {quote_path(run_dir)} 2>/dev/null && [ -f {log} ]; then wc -c < {log}; "
                  f"tail -c +{offset + 1} {log} 2>/dev/null; else echo {MISSING}; fi")


def _complete_node(run: RunDir, node: NodeSpec, transport: Transport, logs: Path) -> str | None:
    """Append what node ``node``'s log has beyond the copy here; a note when that was not possible."""
    local = logs / f"node{node.node_rank}.log"
    have = local.stat().st_size if local.exists() else 0
    whole = f"{run.plan.run_dir}/node{node.node_rank}.log on {node.host}"
    try:
        return _append_rest(run, node, transport, local, have, whole)
    except Exception as exc:  # noqa: BLE001 - a node that cannot be read is named, never a traceback
        detail = exc.detail if isinstance(exc, HostError) else f"{type(exc).__name__}: {exc}"
        return f"fsdpctl: node {node.node_rank} ({node.host}) did not answer ({detail}): its log here may be " \
               f"incomplete ({local.stat().st_size if local.exists() else 0} bytes); the whole file is {whole}"


def _not_asked(run: RunDir, node: NodeSpec, logs: Path) -> str:
    local = logs / f"node{node.node_rank}.log"
    return (f"fsdpctl: node {node.node_rank} ({node.host}) was lost: its log here ends where its stream did "
            f"({local.stat().st_size if local.exists() else 0} bytes); `fsdpctl logs {run.run_id}` completes it once "
            f"the node answers (the whole file is {run.plan.run_dir}/node{node.node_rank}.log on {node.host})")


def _append_rest(run: RunDir, node: NodeSpec, transport: Transport, local: Path, have: int, whole: str) -> str | None:
    stream = transport.stream(_rest_command(run.plan.run_dir, node.node_rank, have))
    mark, head, size = OUTPUT_MARK.encode() + b"\n", b"", None
    with open(os.open(local, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as raw:
        try:
            for chunk in stream.chunks(idle_timeout=IDLE_SECONDS):
                if size is None:
                    head += chunk
                    at = head.find(mark)
                    if at < 0 or b"\n" not in head[at + len(mark):]:
                        continue
                    first, chunk = head[at + len(mark):].split(b"\n", 1)
                    if first.strip() == MISSING.encode():
                        return None  # no log there (yet): nothing to complete
                    size = int(first.strip() or 0)
                    if size < have:
                        return None  # not the log this copy was made from (a new attempt): leave it
                if chunk:
                    raw.write(chunk)
        finally:
            stream.close()
    if size is None:
        return f"fsdpctl: node {node.node_rank} ({node.host}) did not answer: its log here may be incomplete " \
               f"({have} bytes); the whole file is {whole}"
    return None


def rewrite_merged(run: RunDir, logs: Path) -> None:
    """``merged.log`` from the copies of the nodes' logs, node after node."""
    tmp = logs / ".merged.log.tmp"
    with tmp.open("w", encoding="utf-8") as merged:
        for node in run.plan.nodes:
            local = logs / f"node{node.node_rank}.log"
            splitter = LineSplitter(node.node_rank, node.host, f"{local} (and {run.plan.run_dir}/node"
                                                                 f"{node.node_rank}.log on {node.host})")
            if not local.exists():
                continue
            with local.open("rb") as raw:
                while chunk := raw.read(1 << 20):
                    merged.write(shown(splitter.feed(chunk)))
            merged.write(shown(splitter.end()))
    tmp.chmod(0o600)
    os.replace(tmp, logs / "merged.log")


def complete_logs(run: RunDir, connect: Callable[[NodeSpec], Transport], lost: frozenset[int] = frozenset()
                  ) -> list[str]:
    """Bring the run's copy of every node's log up to the node's own file and merged.log with them
    (unless a live launcher is streaming them now, or followed the run to its end); notes for the
    nodes that could not be read. ``lost``: node ranks not even tried (a node just declared lost
    would only cost its connect timeout; a later ``fsdpctl logs`` completes its copy)."""
    record = run.record
    if record.logs_complete or streamed_now(record):
        return []
    logs = private_dir(run.paths.logs)
    with _locked(logs):
        asked = [node for node in run.plan.nodes if node.node_rank not in lost]
        with ThreadPoolExecutor(max_workers=fan_out(len(asked))) as pool:
            notes = [note for note in pool.map(lambda node: _complete_node(run, node, connect(node), logs), asked)
                     if note]
        notes += [_not_asked(run, node, logs) for node in run.plan.nodes if node.node_rank in lost]
        rewrite_merged(run, logs)
        if not notes and record.state.is_over:
            run.change(logs_complete=True)
    return notes
