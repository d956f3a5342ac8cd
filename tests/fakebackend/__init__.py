"""A fake backend, packaged as a third party would package one: a ``Backend`` subclass registered under
the entry point group ``fsdpctl.backends`` (the tests write that entry point; nothing in fsdpctl names
this package). Its "nodes" are processes on this machine (``node.py``), one per host of the profile,
each running its ranks as plain processes, no torchrun, no SSH: fast enough for the contract suite's
fast lane, real enough that every behaviour the contract asks for is its own doing.

The run directory is this machine's (shared by every fake node, like a Slurm directory): each node
writes ``node<R>.log`` and ``node<R>.exit`` there; following a run is reading them.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Optional

from fsdpctl.backends.base import Backend, LineSink, Preflight, ProfileProblem
from fsdpctl.backends.signals import Interrupted, on_stop_signals, raise_interrupted, restore
from fsdpctl.backends.torchrun import has_summary, in_shutdown, torchrun_failure
from fsdpctl.backends.transport import LocalTransport
from fsdpctl.errors import HostError
from fsdpctl.plan.types import NodeTarget, Placement
from fsdpctl.rundir.attempts import attempt_folder, move_into, node_files
from fsdpctl.rundir.lines import LineSplitter, LogLine
from fsdpctl.rundir.outcome import NodeEnd, settle
from fsdpctl.rundir.paths import files_under, private_dir, read_json
from fsdpctl.rundir.record import now
from fsdpctl.rundir.state import NodeState, Outcome, RunState
from fsdpctl.rundir.status import NodeStatus
from fsdpctl.shell import join_path, quote_path

REPO = Path(__file__).resolve().parents[2]
POLL_SECONDS = 0.1
GRACE_SECONDS = 5.0
STAGED = ("pkg", "code")


class FakeBackend(Backend):
    """The profile's hosts as processes on this machine."""

    name = "fake"

    @classmethod
    def check_profile(cls, profile) -> Optional[ProfileProblem]:
        if not profile.hosts:
            return "hosts", "a fake profile needs at least one host", "list a few names under hosts:"
        return None

    @classmethod
    def placement(cls, profile, overrides, context) -> Placement:
        nodes = tuple(NodeTarget(host=h.host, address="127.0.0.1", gpus=h.gpus) for h in profile.hosts)
        workdir = profile.workdir if profile.workdir.startswith(("/", "~")) else join_path(context.local_cwd,
                                                                                          profile.workdir)
        return Placement(backend=cls.name, num_nodes=len(nodes), master_host=nodes[0].host, master_addr="127.0.0.1",
                         python=profile.python or context.local_python, workdir=workdir, nodes=nodes,
                         rdzv_backend="static")

    # ---- a run -----------------------------------------------------------------------------------
    def start(self, run, payload, *, detached: bool, preflight: Optional[Preflight] = None) -> FakeFollower:
        plan = run.plan
        run_dir = private_dir(Path(plan.run_dir).expanduser())
        if plan.attempt > 1:  # the last attempt's node files move aside, as every backend's do
            for node in plan.nodes:
                move_into(run_dir, node_files(node.node_rank), attempt_folder(plan.attempt - 1))
        with tarfile.open(fileobj=io.BytesIO(payload.files.getvalue()), mode="r:") as tar:
            tar.extractall(run_dir, filter="data")
        plain_env = {k: v for k, v in plan.env.items() if "$" not in v}  # what only a node's shell expands is left
        env = {**os.environ, **payload.secrets, "PYTHONPATH": str(REPO)}
        first, nodes = 0, []
        for node in plan.nodes:
            args = {"run_dir": str(run_dir), "node_rank": node.node_rank, "num_nodes": plan.num_nodes,
                    "nproc": int(node.nproc), "first_rank": first, "world": plan.world_size, "host": node.host,
                    "entry": list(plan.entry), "chdir": plan.chdir, "env": plain_env}
            first += int(node.nproc)
            process = _spawn([sys.executable, "-m", "tests.fakebackend.node", json.dumps(args)], env)
            nodes.append(NodeStatus(node_rank=node.node_rank, host=node.host, address=node.address, pid=process.pid,
                                    state=NodeState.RUNNING))
        run.change(state=RunState.RUNNING, nodes=tuple(nodes), started_at=now(), detached=detached)
        return FakeFollower(run, owner=True, how=f"started on {plan.num_nodes} fake node(s)")

    def attach(self, run) -> FakeFollower:
        return FakeFollower(run, owner=False, how="")

    def status(self, run):
        record = run.record
        nodes = list(record.nodes)
        state = record.state
        if not state.is_over:
            nodes = [_node_now(run, n) for n in nodes]
            state = settle([NodeEnd(node_rank=n.node_rank, host=n.host, state=n.state, exit_code=n.exit_code)
                            for n in nodes]).state
        metrics = Path(run.plan.run_dir).expanduser() / "metrics.jsonl"
        last = None
        if metrics.exists():
            rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            last = next((row for row in reversed(rows) if "loss" in row), None)
        return record.status(state=state, nodes=tuple(nodes), last_metrics=last)

    def read_logs(self, run, sink: LineSink, attempt: int | None = None) -> list[str]:
        run_dir = Path(run.plan.run_dir).expanduser()
        plan = run.plan.to_json()
        if attempt not in (None, run.attempt):
            run_dir = run_dir / attempt_folder(attempt)
            plan = read_json(run.root / attempt_folder(attempt) / "plan.json") or plan
        hosts = {n["node_rank"]: n["host"] for n in plan["nodes"]}
        for rank, host in sorted(hosts.items()):
            reader = _LogReader(run_dir / f"node{rank}.log", rank, host)
            reader.read(sink, final=True)
        return []

    def fetch(self, run, path: str) -> dict[str, list[str]]:
        return {"the run directory on this machine": files_under(Path(run.plan.run_dir).expanduser() / path,
                                                                 skip=STAGED)}

    def stop(self, run, grace=None, stop_signal=None) -> dict[str, str]:
        record = run.record
        left = _end_nodes([n.pid for n in record.nodes if n.pid], GRACE_SECONDS if grace is None else grace)
        nodes = tuple(n.replace(state=NodeState.STOPPED) if n.state is NodeState.RUNNING else n for n in record.nodes)
        run.change(state=RunState.STOPPED, nodes=nodes, stopped_at=now())
        return {n.host: " ".join(str(pid) for pid in left if pid == n.pid) for n in record.nodes}

    def ask(self, run, command: str) -> str:
        status, out, err = LocalTransport().run(f"cd {quote_path(run.plan.run_dir)} && {command}", 30)
        if status != 0 and not out:
            raise HostError("fake", "command", err.strip() or f"exit {status}", "look at the run directory")
        return out


class FakeFollower:
    """Reads every node's log as it grows and its exit file when it ends; the owner stops the other
    nodes at the first failure (and all of them on an interruption) and records the end."""

    def __init__(self, run, owner: bool, how: str):
        self.run, self.owner, self.how = run, owner, how

    def follow(self, sink: LineSink, *, watch=None, signals: bool = False,
               leave: threading.Event | None = None) -> Outcome:
        run, plan = self.run, self.run.plan
        run_dir = Path(plan.run_dir).expanduser()
        readers = [_LogReader(run_dir / f"node{n.node_rank}.log", n.node_rank, n.host) for n in plan.nodes]
        pids = {n.node_rank: n.pid for n in run.record.nodes}
        stopped: set[int] = set()
        hang = None

        def show(line: LogLine) -> None:
            if watch is not None:
                watch.saw(line.text)
            sink(line)

        previous = on_stop_signals(raise_interrupted) if signals else {}
        try:
            while True:
                for reader in readers:
                    reader.read(show)
                codes = {rank: _exit_code(run_dir, rank) for rank in pids}
                if all(code is not None or not _alive(pids[rank]) for rank, code in codes.items()):
                    break
                if leave is not None and leave.is_set() and not self.owner:
                    return Outcome(exit_code=0, state=RunState.RUNNING, message=f"stopped following {plan.run_id}")
                failed = [rank for rank, code in codes.items() if code not in (None, 0)]
                if failed and not stopped:
                    stopped = {rank for rank, code in codes.items() if code is None}
                    _end_nodes([pids[rank] for rank in stopped], 0.0)
                silent = watch.due() if watch is not None and hang is None else None
                if silent is not None and (verdict := watch.fire(silent)).stop:
                    hang, stopped = verdict.failure, set(pids)
                    _end_nodes(list(pids.values()), GRACE_SECONDS)
                time.sleep(POLL_SECONDS)
        except (Interrupted, KeyboardInterrupt) as stop:
            signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
            if not self.owner:
                return Outcome(exit_code=128 + signum, state=RunState.RUNNING, interrupted_by=signum,
                               message=f"stopped following; run {plan.run_id} goes on")
            _end_nodes(list(pids.values()), GRACE_SECONDS)
            return self._record(run_dir, readers, pids, set(pids), show, interrupted_by=signum)
        finally:
            restore(previous)
        return self._record(run_dir, readers, pids, stopped, show, hang=hang)

    def _record(self, run_dir: Path, readers, pids, stopped, show, interrupted_by=None, hang=None) -> Outcome:
        for reader in readers:
            reader.read(show, final=True)
        ends = []
        for reader in readers:
            code = _exit_code(run_dir, reader.rank)
            lines = reader.tail
            failure = torchrun_failure(lines, host=reader.host, node_rank=reader.rank, exit_code=code) \
                if code not in (None, 0) and has_summary(lines) else None
            state = NodeState.SUCCEEDED if code == 0 else NodeState.FAILED if code is not None else NodeState.GONE
            ends.append(NodeEnd(node_rank=reader.rank, host=reader.host, state=state, exit_code=code,
                                failure=failure, stopped=reader.rank in stopped))
        settled = settle(ends, interrupted_by=interrupted_by, hang=hang)
        failure = in_shutdown(settled.first_failure, str(run_dir), self.run.plan.attempt, _read_text)
        nodes = tuple(NodeStatus(node_rank=e.node_rank, host=e.host, pid=pids.get(e.node_rank), state=e.state,
                                 exit_code=e.exit_code) for e in ends)
        record = self.run.record
        if self.owner or (record.detached and record.state is RunState.RUNNING):
            self.run.change(state=settled.state, exit_code=settled.exit_code, first_failure=failure,
                            nodes=nodes, finished_at=now())
        return Outcome(exit_code=settled.exit_code or 0, state=settled.state, first_failure=failure,
                       interrupted_by=interrupted_by)


def _read_text(path: str) -> Optional[str]:
    try:
        return Path(path).read_text()
    except OSError:
        return None


class _LogReader:
    """One node's log, read as it grows, into lines; the last ones kept for its failure."""

    def __init__(self, path: Path, rank: int, host: str):
        self.path, self.rank, self.host = path, rank, host
        self.offset = 0
        self.splitter = LineSplitter(rank, host, str(path))
        self.tail: list[str] = []

    def read(self, sink: LineSink, final: bool = False) -> None:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        lines = self.splitter.feed(data) + (self.splitter.end() if final else [])
        for line in lines:
            self.tail = [*self.tail[-199:], line.stored()]
            sink(line)


def _spawn(argv: list[str], env: dict[str, str]):
    import subprocess

    # Its own session: the node outlives this process (a detached run), and is ended as a group.
    return subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _exit_code(run_dir: Path, rank: int) -> int | None:
    try:
        text = (run_dir / f"node{rank}.exit").read_text().strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() else 255


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)  # a node this process started is reaped here
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _end_nodes(pids: list[int], grace: float) -> list[int]:
    """TERM each node's process group (the node forwards it to its ranks), then KILL what is left."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace + GRACE_SECONDS
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    for pid in pids:
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    return [pid for pid in pids if _alive(pid)]


def _node_now(run, node: NodeStatus) -> NodeStatus:
    code = _exit_code(Path(run.plan.run_dir).expanduser(), node.node_rank)
    if code is not None:
        return node.replace(exit_code=code, state=NodeState.SUCCEEDED if code == 0 else NodeState.FAILED)
    return node.replace(state=NodeState.RUNNING if _alive(node.pid) else NodeState.GONE)


__all__ = ["FakeBackend"]
