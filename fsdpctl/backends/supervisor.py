"""Follow a run's nodes: start them, stream their output, poll them, and end them all on the first failure.

The commands themselves are the node protocol (``node_commands``); this module runs them over each
node's transport, in parallel, and decides what failed first.
"""

from __future__ import annotations

import base64
import io
import os
import queue
import re
import tarfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import FsdpctlError, HostError
from ..plan.types import LaunchPlan, NodeSpec
from ..shell import OUTPUT_MARK, after_mark, marked
from .node_commands import FETCH_MISSING, fetch_command, follow_command, kill_command, poll_command
from .transport import Transport

GRACE_SECONDS = 10.0
POLL_SECONDS = 2.0
# While a node's log stream is open it says when the node ends; polls (an SSH command each, with the
# login shell's rc files, on nodes busy starting torch) are then only a safety net.
SAFETY_POLL_SECONDS = 10.0
COMMAND_TIMEOUT = 30.0
FETCH_TIMEOUT = 600.0
TAIL_LINES = 30
# Lines kept per node for the failure summary: torchrun's Root Cause block and the failing rank's
# traceback are at the end; older lines are in the log files, not in memory.
KEEP_LINES = 2000
LineSink = Callable[[int, str, str], None]  # (node rank, host, line)


# ---- a run in progress ------------------------------------------------------------------------

@dataclass
class NodeRun:
    """One node's part of the run, as far as fsdpctl knows."""

    node: NodeSpec
    transport: Transport
    pid: int = 0
    exit_code: int | None = None
    state: str = "starting"  # starting, running, succeeded, failed, lost
    streaming: bool = True  # its log stream is open
    tail: deque = field(default_factory=lambda: deque(maxlen=KEEP_LINES))

    @property
    def rank(self) -> int:
        return self.node.node_rank


def node_records(runs: Sequence[NodeRun]) -> list[dict[str, Any]]:
    """Each node as run.json records it."""
    return [{"node_rank": r.rank, "host": r.node.host, "pid": r.pid, "state": r.state, "exit_code": r.exit_code}
            for r in runs]


@dataclass(frozen=True)
class RunResult:
    """How the run ended: the job's exit code, and the first failure if there was one."""

    exit_code: int
    first_failure: dict[str, Any] | None
    interrupted: bool


def _parallel(fn: Callable[[NodeRun], Any], runs: Sequence[NodeRun]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(runs)))) as pool:
        return list(pool.map(fn, runs))


def stop_run(run_id: str, transports: Sequence[Transport], grace: float = GRACE_SECONDS) -> dict[str, str]:
    """End every process of ``run_id`` on every node; returns what each host reported remaining."""
    def kill(transport: Transport) -> str:
        try:
            _, out, _ = transport.run(marked(kill_command(run_id, grace)), grace + COMMAND_TIMEOUT)
            return after_mark(out).strip().rsplit("remaining:", 1)[-1].strip()
        except HostError as exc:
            return f"unreachable: {exc.detail}"

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(transports)))) as pool:
        return dict(zip([t.host for t in transports], pool.map(kill, transports), strict=True))


def _follow(run: NodeRun, run_dir: str, lines: queue.Queue) -> None:
    try:
        stream = run.transport.stream(follow_command(run_dir, run.rank, run.pid))
        started = False
        for line in stream.lines():
            if started:
                lines.put((run, line))
            started = started or line == OUTPUT_MARK  # before it: whatever the shell's rc printed
        stream.close()
    except (HostError, OSError, EOFError):
        pass  # the poll loop decides whether the host is gone
    lines.put((run, None))


_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_ERROR_FILE = re.compile(r"error_file\s*:\s*(\S+)")
_FAILED_AT = re.compile(r"time\s*:\s*(\S+)")
# What a rank says when another one died under it: such a failure is a consequence, not the cause.
_PEER_GONE = re.compile(r"Connection reset by peer|Connection closed by peer|remote worker|remote process exited|"
                        r"communicator was aborted|Broken pipe", re.IGNORECASE)


def first_failure_of(run: NodeRun, log_lines: Sequence[str]) -> dict[str, Any]:
    """What failed on a node: torchrun's 'Root Cause' block when it printed one, else the node."""
    failure: dict[str, Any] = {"host": run.node.host, "node_rank": run.rank, "exit_code": run.exit_code,
                               "state": run.state, "rank": None, "local_rank": None, "error_file": None}
    text = "\n".join(log_lines)
    cause = text.rfind("Root Cause (first observed failure)")
    if cause >= 0:
        block = text[cause:cause + 2000]
        if match := _ROOT_CAUSE.search(block):
            failure["rank"], failure["local_rank"] = int(match.group(1)), int(match.group(2))
        if match := _EXITCODE.search(block):
            failure["exit_code"] = int(match.group(1))
        if match := _ERROR_FILE.search(block):
            failure["error_file"] = None if match.group(1) == "<N/A>" else match.group(1)
        if match := _FAILED_AT.search(block):
            failure["failed_at"] = match.group(1)
    if failure["rank"] is not None:
        prefix = f"[rank{failure['rank']}]:"
        own = [line for line in log_lines if line.startswith(prefix)]
        failure["last_lines"] = (own or list(log_lines))[-TAIL_LINES:]
    else:
        failure["last_lines"] = list(log_lines)[-TAIL_LINES:]
    failure["peer_gone"] = any(_PEER_GONE.search(line) for line in failure["last_lines"])
    return failure


def root_cause(failures: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The failure that caused the others: one that is not a rank reporting that a peer went away,
    then the earliest by torchrun's failure time, then the lowest node rank. Time alone misleads:
    torchrun stamps a worker killed by a signal when its monitor notices, which can be after its
    peers' "connection reset" exceptions were stamped (seen under load: a second later)."""
    return min(failures, key=lambda f: (f["peer_gone"], f.get("failed_at") or "9999", f["node_rank"]))


class Supervisor:
    """Streams every node's lines to a sink and local files, polls the nodes, and fails fast."""

    def __init__(self, plan: LaunchPlan, runs: list[NodeRun], log_dir: Path, sink: LineSink,
                 grace: float = GRACE_SECONDS, write_local: bool = True, stop_on_interrupt: bool = True,
                 mask: Callable[[str], str] = str):
        self.plan, self.runs, self.log_dir, self.sink, self.grace = plan, runs, log_dir, sink, grace
        self.mask = mask  # the run's secrets, masked in every line shown or kept
        self.write_local = write_local  # False for a second follower: the launching process writes them
        self.stop_on_interrupt = stop_on_interrupt  # Ctrl-C on `logs -f` ends the following, not the run
        self.lines: queue.Queue = queue.Queue()
        self.first_failure: dict[str, Any] | None = None
        self.open_streams = len(runs)
        self.files: dict[int, Any] = {}
        self.merged: Any = None
        self.finished = threading.Event()

    def _open(self, name: str):
        if self.write_local:
            return (self.log_dir / name).open("a", encoding="utf-8")
        return open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - closed in run()'s finally

    def run(self) -> RunResult:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for run in self.runs:
            threading.Thread(target=_follow, args=(run, self.plan.run_dir, self.lines), daemon=True).start()
        # Polls are SSH round trips: a thread of their own, so printing never waits behind one.
        threading.Thread(target=self._poller, daemon=True).start()
        interrupted = False
        self.files = {run.rank: self._open(f"node{run.rank}.log") for run in self.runs}
        self.merged = self._open("merged.log")
        try:
            while self.open_streams or any(r.state == "running" for r in self.runs):
                try:
                    batch = [self.lines.get(timeout=POLL_SECONDS * 2)]
                except queue.Empty:
                    continue
                while len(batch) < 1000:  # whatever else is already here, then one flush for all
                    try:
                        batch.append(self.lines.get_nowait())
                    except queue.Empty:
                        break
                for run, item in batch:
                    if isinstance(item, tuple):
                        self._settle(run, item)
                    else:
                        self._take(run, item)
                        if item is None and run.state == "running":
                            self._settle(run, self._ask(run))  # its log ended: it has probably just exited
                self._flush()
        except KeyboardInterrupt:
            interrupted = True
            if self.stop_on_interrupt:
                stop_run(self.plan.run_id, [r.transport for r in self.runs], self.grace)
                self._drain(2.0)
                for run in self.runs:
                    if run.state == "running":
                        run.state, run.exit_code = "failed", 130
        finally:
            self.finished.set()
            for handle in (*self.files.values(), self.merged):
                handle.close()
        return self._result(interrupted)

    def _poller(self) -> None:
        last = {run.rank: time.monotonic() for run in self.runs}
        while not self.finished.wait(POLL_SECONDS):
            for run in self.runs:
                due = not run.streaming or time.monotonic() - last[run.rank] >= SAFETY_POLL_SECONDS
                if run.state == "running" and due and not self.finished.is_set():
                    last[run.rank] = time.monotonic()
                    self.lines.put((run, self._ask(run)))

    def _take(self, run: NodeRun, line: str | None) -> None:
        """One item from the followers: a line, or (None) the end of that node's stream."""
        if line is None:
            self.open_streams -= 1
            run.streaming = False
            return
        line = self.mask(line)
        run.tail.append(line)
        self.files[run.rank].write(line + "\n")
        self.merged.write(f"[{run.node.host} r{run.rank}] {line}\n")
        self.sink(run.rank, run.node.host, line)

    def _flush(self) -> None:
        for handle in (*self.files.values(), self.merged):
            handle.flush()
        flush = getattr(self.sink, "flush", None)
        if flush is not None:
            flush()

    def _drain(self, seconds: float) -> None:
        """Take what the followers still deliver within ``seconds`` (stream ends included)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                run, item = self.lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if not isinstance(item, tuple):
                self._take(run, item)
        self._flush()

    def _ask(self, run: NodeRun) -> tuple[str, ...]:
        """The node's own word on its script: ("exit", code), ("running",), ("gone",) or ("lost", why)."""
        try:
            _, out, _ = run.transport.run(marked(poll_command(self.plan.run_dir, run.rank, run.pid)),
                                          COMMAND_TIMEOUT)
        except (HostError, FsdpctlError, OSError) as exc:
            return ("lost", str(exc))
        words = after_mark(out).strip().split()
        if words[:1] == ["exit"] and len(words) == 2 and words[1].lstrip("-").isdigit():
            return ("exit", words[1])
        return ("gone",) if words[:1] == ["gone"] else ("running",)

    def _settle(self, run: NodeRun, answer: tuple[str, ...]) -> None:
        """Apply a poll's answer to the node; a failure ends the others."""
        if run.state != "running":
            return
        if answer[0] == "exit":
            run.exit_code = int(answer[1])
            run.state = "succeeded" if run.exit_code == 0 else "failed"
        elif answer[0] == "lost":
            run.state, run.exit_code = "lost", 255
            run.tail.append(f"fsdpctl: host stopped answering: {answer[1]}")
        elif answer[0] == "gone":
            run.state, run.exit_code = "failed", 255
            run.tail.append("fsdpctl: the node script's wrapper vanished without an exit status")
        if run.state in ("failed", "lost"):
            self._fail(run)

    def _fail(self, run: NodeRun) -> None:
        if self.first_failure is not None:
            return
        self._drain(0.5)  # torchrun's last lines (its failure summary) may still be on their way
        self.first_failure = first_failure_of(run, list(run.tail))
        if "failed_at" not in self.first_failure:  # torchrun itself died: it failed now
            self.first_failure["failed_at"] = time.strftime("%Y-%m-%d_%H:%M:%S")
        others = [r for r in self.runs if r is not run and r.state == "running"]
        if others:
            stop_run(self.plan.run_id, [r.transport for r in others], self.grace)

    def _result(self, interrupted: bool) -> RunResult:
        if self.first_failure is not None:
            # The first node seen failing may only have lost a peer: decide once every node has ended.
            failed = [self.first_failure] + [first_failure_of(r, list(r.tail)) for r in self.runs
                                             if r.state in ("failed", "lost")
                                             and r.rank != self.first_failure["node_rank"]]
            self.first_failure = root_cause(failed)
        if interrupted:
            return RunResult(130, self.first_failure, True)
        if self.first_failure is not None:
            code = self.first_failure["exit_code"]
            if isinstance(code, int) and code < 0:  # torchrun reports a worker killed by signal N as -N
                code = 128 - code
            return RunResult(code if isinstance(code, int) and code > 0 else 1, self.first_failure, False)
        return RunResult(0, None, False)


def fetch_from_node(transport: Transport, run_dir: str, path: str, dest: Path,
                    timeout: float = FETCH_TIMEOUT) -> list[str]:
    """Copy ``path`` (under the node's run directory) into ``dest``; returns the files that came
    (empty when the node has no such path). Raises HostError."""
    status, out, err = transport.run(marked(fetch_command(run_dir, path)), timeout)
    out = after_mark(out).strip()
    if out == FETCH_MISSING or (status == 0 and not out):
        return []
    if status != 0:
        raise HostError(transport.host, "fetch", f"could not read {path}: {err.strip() or f'exit {status}'}",
                        "look at the run directory on that node")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out)), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
        tar.extractall(dest, members=members, filter="data")
        return sorted(str(dest / m.name) for m in members if m.isfile())


def fetch_logs(plan: LaunchPlan, runs: Sequence[NodeRun], local_dir: Path,
               mask_bytes: Callable[[bytes], bytes] | None = None) -> None:
    """Copy each node's torchrun log folder (``logs/node<R>``) into the local run directory, with the
    run's secrets masked in every file (``mask_bytes``)."""
    def fetch(run: NodeRun) -> None:
        try:
            files = fetch_from_node(run.transport, plan.run_dir, f"logs/node{run.rank}", local_dir)
        except HostError:
            return  # its streamed log is here anyway
        for name in files if mask_bytes else ():
            data = Path(name).read_bytes()
            if (masked := mask_bytes(data)) != data:
                Path(name).write_bytes(masked)

    _parallel(fetch, runs)
