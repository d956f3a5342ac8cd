"""A run's nodes as fsdpctl tracks them: their state, ending them, fetching from them, and deciding
which failure caused the others.

The commands themselves are the node protocol (``node_commands``); this module runs them over each
node's transport, in parallel.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import HostError
from ...node.startup.sitecustomize import ENDED_DIR
from ...plan.types import LaunchPlan, NodeSpec
from ...rundir.lines import LineSplitter
from ...rundir.outcome import Settled
from ...rundir.paths import private_dir
from ...rundir.rundir import RunDir
from ...rundir.state import Failure, NodeState
from ...rundir.status import NodeStatus
from ...shell import after_mark, marked, quote_path
from ..torchrun import torchrun_failure
from ..transport import Session, Transport, fan_out
from .agent import GRACE_SECONDS
from .commands import FETCH_MISSING, fetch_command, kill_command

COMMAND_TIMEOUT = 30.0
FETCH_TIMEOUT = 600.0
# Lines kept per node for the failure summary: torchrun's Root Cause block and the failing rank's
# traceback are at the end; older lines are in the log files, not in memory.
KEEP_LINES = 2000
@dataclass
class NodeRun:
    """One node's part of the run, as far as fsdpctl knows."""

    node: NodeSpec
    transport: Transport
    pid: int = 0
    exit_code: int | None = None
    state: NodeState = NodeState.STARTING
    streaming: bool = True  # its log stream is open
    side_streaming: bool = False  # a reader of its side files (metrics, GPU samples) still sends
    tail: deque = field(default_factory=lambda: deque(maxlen=KEEP_LINES))
    session: Session | None = None
    """The node agent that started it and watches over it (a foreground run started here)."""
    splitter: LineSplitter | None = None
    """Its log's bytes into lines, as they arrive."""
    received: int = 0
    """Bytes of its log that arrived here."""
    last_heard: float = field(default_factory=time.monotonic)
    lost_reason: str | None = None
    """Why the node counts as lost (it stopped answering), when it does."""
    stopped: bool = False
    """fsdpctl ended it (another node had failed, or the launcher was told to stop)."""
    seen_failing_at: str | None = None
    """When fsdpctl saw it fail first of all the nodes."""

    @property
    def rank(self) -> int:
        return self.node.node_rank


def node_records(runs: Sequence[NodeRun]) -> tuple[NodeStatus, ...]:
    """Each node as run.json records it."""
    return tuple(NodeStatus(node_rank=r.rank, host=r.node.host, address=r.node.address, pid=r.pid, state=r.state,
                            exit_code=r.exit_code, log_bytes=r.received, stopped=r.stopped, detail=r.lost_reason,
                            signal=first_failure_of(r).signal if r.state == NodeState.FAILED else None)
                 for r in runs)


@dataclass(frozen=True)
class RunResult:
    """How following the run ended: the run settled from its nodes, the signal that interrupted the
    launcher (SIGINT for a KeyboardInterrupt) if one did, and whether the follower left before the end."""

    settled: Settled
    signal: int | None = None
    left: bool = False

    @property
    def exit_code(self) -> int:
        return self.settled.exit_code or 0

    @property
    def first_failure(self) -> Failure | None:
        return self.settled.first_failure

    @property
    def interrupted(self) -> bool:
        return self.signal is not None

    @property
    def hung(self) -> bool:
        """The hang watchdog ended the run."""
        failure = self.settled.first_failure
        return self.signal is None and failure is not None and failure.kind == "hang"


def stop_run(run_id: str, transports: Sequence[Transport], grace: float = GRACE_SECONDS,
             runtime: str | None = None, first: str | None = None, run_dir: str | None = None) -> dict[str, str]:
    """End every process of ``run_id`` on every node (and remove its containers, with the ``runtime``
    they run in); returns what each host reported remaining. ``first``: a signal's name (``TERM``,
    ``USR1``) every rank gets first, with ``grace`` seconds to exit by themselves, the stop marked in
    ``run_dir`` (``kill_command``)."""
    def kill(transport: Transport) -> str:
        try:
            _, out, _ = transport.run(marked(kill_command(run_id, grace, runtime, first, run_dir)),
                                      grace + (2.0 if first else 0.0) + COMMAND_TIMEOUT)
            return after_mark(out).strip().rsplit("remaining:", 1)[-1].strip()
        except HostError as exc:
            return f"unreachable: {exc.detail}"

    with ThreadPoolExecutor(max_workers=fan_out(len(transports))) as pool:
        return dict(zip([t.host for t in transports], pool.map(kill, transports), strict=True))


def first_failure_of(run: NodeRun, failed_at: str | None = None) -> Failure:
    """What failed on a node, from its last lines (torchrun's summary when it printed one).
    ``failed_at``: when fsdpctl saw it, if torchrun's summary does not say."""
    lost = run.state == NodeState.LOST
    return torchrun_failure([line.stored() for line in run.tail], host=run.node.host, node_rank=run.rank,
                            exit_code=run.exit_code, failed_at=failed_at,
                            lost=(run.lost_reason or "it stopped answering") if lost else None)


def fetch_from_node(transport: Transport, run_dir: str, path: str | Sequence[str], dest: Path,
                    timeout: float = FETCH_TIMEOUT) -> list[str]:
    """Copy ``path`` (under the node's run directory; several: those that exist, in one command) into
    ``dest``; returns the files that came (empty when the node has none of them). Raises HostError."""
    paths = (path,) if isinstance(path, str) else tuple(path)
    status, out, err = transport.run(marked(fetch_command(run_dir, *paths)), timeout)
    out = after_mark(out).strip()
    if out == FETCH_MISSING or (status == 0 and not out):
        return []
    if status != 0:
        why = err.strip() or f"exit {status}"
        raise HostError(transport.host, "fetch", f"could not read {', '.join(paths)}: {why}",
                        "look at the run directory on that node")
    private_dir(dest)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(out)), mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
        for member in members:  # this user's only here, whatever the node's modes were (torchrun's are 0755)
            member.mode = 0o700 if member.mode & 0o100 else 0o600
            private_dir((dest / member.name).parent)  # a folder above it (flight/ of flight/on-timeout) too
        tar.extractall(dest, members=members, filter="data")
        for member in members:
            if member.isdir():  # the data filter makes folders with the umask's mode
                (dest / member.name).chmod(0o700)
        return sorted(str(dest / m.name) for m in members if m.isfile())


FLIGHT_ON_TIMEOUT = "flight/on-timeout"
"""Where torch's NCCL watchdog dumps its flight recorder when a collective times out (the plan's
``TORCH_FR_DUMP_TEMP_FILE``), under a node's run directory."""


class EndFetch:
    """Each node's torchrun log folder (``logs/node<R>``) and flight-recorder dumps, copied into the
    local run directory as soon as that node has ended, while the others are still being stopped:
    the run's end is said when the last node ends, not after a copy from every node. The run's
    secrets are masked in the logs (``mask_bytes``)."""

    def __init__(self, plan: LaunchPlan, local_dir: Path, mask_bytes: Callable[[bytes], bytes] | None = None):
        self.plan, self.local_dir, self.mask_bytes = plan, local_dir, mask_bytes
        self.pool = ThreadPoolExecutor(max_workers=fan_out(len(plan.nodes)), thread_name_prefix="fsdpctl-fetch")
        self.fetches: dict[int, Any] = {}

    def node_ended(self, run: NodeRun) -> None:
        """Start copying ``run``'s files (its script has ended: torchrun wrote its last)."""
        if run.rank not in self.fetches and run.state != NodeState.LOST:
            self.fetches[run.rank] = self.pool.submit(self._fetch, run)

    def finish(self, runs: Sequence[NodeRun]) -> dict[str, list[str]]:
        """Every node's copy done (those not started yet: now; a lost node's: never, it does not
        answer and its streamed log is here anyway); the flight-recorder dumps that came, by node."""
        for run in runs:
            self.node_ended(run)
        try:
            return {label: flight for label, flight, _ in (self.fetches[r.rank].result() for r in runs
                                                           if r.rank in self.fetches)}
        finally:
            self.pool.shutdown(wait=False)

    def copy_of(self, rank: int, node_path: str, wait: float = COMMAND_TIMEOUT) -> Path | None:
        """Where the copy here of ``node_path`` (a file under node ``rank``'s run directory, as the
        node names it) is once that node's copy is done, whether or not the node had it; None when
        the copy does not hold that path, failed, or is not done within ``wait`` seconds: read it on
        the node. The failing node ends first, so its copy is usually done by the time it is asked."""
        future = self.fetches.get(rank)
        relative = relative_to_run(node_path, self.plan.run_id)
        if future is None or relative is None or not relative.startswith((f"logs/node{rank}/", f"{ENDED_DIR}/")):
            return None
        try:
            if not future.result(timeout=wait)[2]:
                return None
        except Exception:  # noqa: BLE001 - not done in time, or the copy broke (finish() says so): ask the node
            return None
        local = (self.local_dir / relative).resolve()
        return local if local.is_relative_to(self.local_dir.resolve()) else None

    def _fetch(self, run: NodeRun) -> tuple[str, list[str], bool]:
        label = f"node {run.rank} ({run.node.host})"
        logs = f"logs/node{run.rank}"
        try:
            files = fetch_from_node(run.transport, self.plan.run_dir, (logs, FLIGHT_ON_TIMEOUT, ENDED_DIR),
                                    self.local_dir)
        except HostError as exc:
            return f"{label}: {exc.detail}", [], False
        for name in files if self.mask_bytes else ():
            if Path(name).is_relative_to(self.local_dir / logs):  # a flight dump is torch's pickle: left whole
                data = Path(name).read_bytes()
                if (masked := self.mask_bytes(data)) != data:
                    Path(name).write_bytes(masked)
        return label, [name for name in files if Path(name).is_relative_to(self.local_dir / FLIGHT_ON_TIMEOUT)], True


def relative_to_run(node_path: str, run_id: str) -> str | None:
    """``node_path`` (absolute, or under ``~``, as a node or its torchrun names it) relative to the
    run's directory there (``<workdir>/runs/<run id>``); None when it is not under it. A path a
    rank's output gave is not trusted: one that climbs out (``..``) is not under it."""
    _, found, rest = node_path.partition(f"/runs/{run_id}/")
    if not found or not rest or ".." in Path(rest).parts:
        return None
    return rest


def recorded_node_runs(run: RunDir, connect: Callable[[NodeSpec], Transport]) -> list[NodeRun]:
    """The run's nodes as run.json records them (their process ids), to follow from outside."""
    pids = {n.node_rank: n.pid or 0 for n in run.record.nodes}
    return [NodeRun(node, connect(node), pid=pids.get(node.node_rank, 0), state=NodeState.RUNNING)
            for node in run.plan.nodes]


def read_node_text(transport: Transport, path: str) -> str | None:
    """A small file's text, read on its node (None: there is none, or the node does not answer)."""
    try:
        status, out, _ = transport.run(marked(f"cat {quote_path(path)} 2>/dev/null"), 30)
    except HostError:
        return None
    return after_mark(out) if status == 0 else None


def read_error_file(read: Callable[[str], str | None], path: str) -> str | None:
    """The message of a failed rank's torchelastic error file (written by @record); ``read`` gives a
    file's text (on its node, or from the copy of it here)."""
    text = read(path)
    try:
        message = json.loads(text).get("message", {}) if text is not None else None
    except (ValueError, AttributeError):
        return None
    if message is None:
        return None
    text = message.get("message") if isinstance(message, dict) else message
    return str(text).strip().splitlines()[-1] if text else None
