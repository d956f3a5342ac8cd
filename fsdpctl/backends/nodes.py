"""Nodes that fsdpctl starts itself, one transport each: this machine (``local``) or SSH hosts (``ssh``).

Both speak the same node protocol (``node_commands``) and share the supervisor; a subclass says only
how a node is reached, which Python runs there by default, and where the master is.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

from ..bundle import Payload
from ..errors import HostError
from ..hostcheck.checks import DoctorReport, HostReport
from ..hostcheck.fanout import ProbeRunner, make_jobs, run_doctor
from ..node.mask import Masker
from ..node.stacks import answer_of
from ..plan.types import LaunchPlan
from ..profiles.schema import ClusterProfile
from ..rundir.attempts import attempt_folder
from ..rundir.lines import LogLine
from ..rundir.outcome import NodeEnd, settle
from ..rundir.paths import files_under
from ..rundir.record import now
from ..rundir.rundir import RunDir, last_metrics
from ..rundir.state import NodeState, Outcome, RunState
from ..rundir.status import NodeStatus, RunStatus
from ..shell import after_mark, marked, quote_path
from ..workload.layout import complete_steps_command, parse_steps
from .base import DoctorRequest, LineSink
from .feeds import AgentFeed, TailFeed
from .hang_watch import HangWatch
from .log_copy import complete_logs, launcher_record
from .node_commands import STAGED, Exited, Running, parse_poll, poll_command, stacks_command
from .node_runs import COMMAND_TIMEOUT, NodeRun, fetch_from_node, fetch_logs, node_records, stop_run
from .starter import NodeStarter
from .supervisor import Supervisor
from .transport import Transport

PREFLIGHT_TIMEOUT = 20.0
STACKS_TIMEOUT = 60.0
# A line of the merged log: "[host rN] text".
_MERGED_LINE = re.compile(r"^\[(?P<host>\S+) r(?P<node>\d+)\] (?P<text>.*)$")


class NodesBackend:
    """The node protocol over one transport per node (connections open on first use)."""

    name: ClassVar[str]
    queued: ClassVar[bool] = False
    port_check: ClassVar[bool]
    """Whether the rendezvous port can be tried between nodes (not on one machine)."""

    def __init__(self, profile: ClusterProfile, transports: list[Transport] | None = None):
        self.profile = profile
        self._transports = transports
        self._starter: NodeStarter | None = None  # agents the preflight staged, waiting for start
        self._started: dict[str, list[NodeRun]] = {}  # runs this process started, with their agents

    # ---- what a subclass says --------------------------------------------------------------------
    def open_transports(self) -> list[Transport]:
        """One transport per node, in node-rank order."""
        raise NotImplementedError

    def default_python(self) -> str:
        """The nodes' interpreter when the profile names none."""
        raise NotImplementedError

    def master(self) -> tuple[int, str]:
        """The master's node rank and the address the other nodes reach it at."""
        raise NotImplementedError

    # ---- shared ----------------------------------------------------------------------------------
    @property
    def transports(self) -> list[Transport]:
        if self._transports is None:
            self._transports = self.open_transports()
        return self._transports

    @property
    def python(self) -> str:
        return self.profile.python or self.default_python()

    def close(self) -> None:
        if self._starter is not None:
            self._starter.close()
            self._starter = None
        for transport in self._transports or []:
            transport.close()
        self._transports = None

    def doctor(self, request: DoctorRequest, on_host: Callable[[HostReport], None] | None = None,
               runner: ProbeRunner | None = None) -> DoctorReport:
        master_rank, master_addr = self.master()
        jobs = make_jobs(self.profile, self.transports, master_rank, master_addr, request.port, request.deep,
                         request.port_check and self.port_check, requirements=request.requirements,
                         extra=request.extra)
        return run_doctor(self.profile, jobs, python=self.python, timeout=request.timeout, nproc=request.nproc,
                          concurrency=request.concurrency, on_host=on_host, runner=runner)

    def preflight(self, plan: LaunchPlan, payload: Payload,
                  on_host: Callable[[HostReport], None] | None = None) -> DoctorReport:
        """doctor's fast checks on the plan's own nodes and rendezvous port, answered by the node agents
        that also stage the payload; they wait for ``start`` (one command per node for both)."""
        nproc = int(plan.nproc_per_node) if plan.nproc_per_node.isdigit() else None
        request = DoctorRequest(port=plan.master_port, timeout=PREFLIGHT_TIMEOUT, nproc=nproc,
                                port_check=plan.num_nodes > 1, requirements=plan.requirements)
        self._starter = NodeStarter(plan, payload, self.transports, plan.python)
        return self.doctor(request, on_host, runner=self._starter.probe_runner())

    def previews(self, plan: LaunchPlan, scripts: dict[str, str]) -> dict[str, str]:
        return {}  # the node scripts are all there is

    def start(self, run: RunDir, payload: Payload, *, detached: bool) -> str:
        """Start every node (staging it too, unless the preflight did), and record their process ids."""
        starter = self._starter if self._starter is not None and self._starter.plan.run_id == run.run_id \
            else NodeStarter(run.plan, payload, self.transports, run.plan.python)
        self._starter = None
        # A foreground run's agents stay on to watch over their nodes for this process; a detached
        # run is meant to outlive it, and its agents leave.
        started = starter.start(watch=0.0 if detached else float(run.plan.node_timeout))
        self._started[run.run_id] = started
        run.change(state=RunState.RUNNING, nodes=node_records(started), started_at=now(), detached=detached,
                   launcher=None if detached else launcher_record())
        world = run.plan.world_size or "from GPU count"
        return f"started on {run.plan.num_nodes} node(s), world size {world}"

    def _node_runs(self, run: RunDir) -> list[NodeRun]:
        pids = {n.node_rank: n.pid or 0 for n in run.record.nodes}
        return [NodeRun(node, transport, pid=pids.get(node.node_rank, 0), state=NodeState.RUNNING)
                for node, transport in zip(run.plan.nodes, self.transports, strict=True)]

    def follow(self, run: RunDir, sink: LineSink, *, owner: bool, watch: HangWatch | None = None,
               signals: bool = False, leave: threading.Event | None = None) -> Outcome:
        """Stream every node until the run ends, failing fast. The owner keeps the local logs, ends
        the run when interrupted, collects torchrun's log folders and records the outcome."""
        plan = run.plan
        started = self._started.pop(run.run_id, None)
        watched = owner and started is not None and all(r.session is not None for r in started)
        node_runs = started if watched else self._node_runs(run)
        feed = AgentFeed(plan.node_timeout) if watched else TailFeed()
        # The values are in this environment (they were read from it at launch; a follower in another
        # shell may have them too); the nodes mask their logs themselves as well.
        masker = Masker([os.environ.get(name, "") for name in plan.secrets])
        result = Supervisor(plan, node_runs, run.paths.logs, sink, feed, write_local=owner,
                            stop_on_interrupt=owner, mask=masker.text if masker else None, watch=watch, signals=signals,
                            leave=None if owner else leave).run()
        if result.left:
            return Outcome(exit_code=0, state=RunState.RUNNING, message=f"stopped following; run {plan.run_id} goes on")
        if result.interrupted and not owner:
            return Outcome(exit_code=result.exit_code, state=RunState.RUNNING, interrupted_by=result.signal,
                           message=f"stopped following; run {plan.run_id} goes on (end it with "
                                   f"`fsdpctl stop {plan.run_id}`)")
        failure = result.first_failure
        if failure and failure.error_file and failure.kind == "exit":
            error = read_error_file(node_runs[failure.node_rank].transport, failure.error_file)
            failure = dataclasses.replace(failure, error=masker.text(error) if error else error)
        state = result.settled.state
        record = run.record
        if result.hung and not owner and not record.detached:
            # The launcher that owns it does the same; this follower only reports.
            return Outcome(exit_code=result.exit_code, state=RunState.FAILED, first_failure=failure)
        lost = any(r.state == NodeState.LOST or r.streaming for r in node_runs)  # a stream cut short
        recorded = {"finished_at": now(), "exit_code": result.exit_code, "first_failure": failure}
        notes: list[str] = []
        if owner:
            if Path(plan.run_dir).expanduser().resolve() != run.root.resolve():
                fetch_logs(plan, node_runs, run.root, masker.bytes if masker else None)
            # Every stream ran to its node's end: the copies here are whole (a lost node's is not).
            run.change(state=state, nodes=node_records(node_runs), logs_complete=not lost, **recorded)
            if lost:  # what the node logged since its stream was cut, if it answers now
                notes = complete_logs(run, self.transports)
        elif record.detached and run.record.state is RunState.RUNNING:
            # Only a follower of a detached run that nobody else has settled (stop writes "stopped")
            # records how it ended.
            run.change(state=state, nodes=node_records(node_runs), **recorded)
        message = None
        if result.interrupted:
            by = signal.Signals(result.signal).name if result.signal else "a signal"
            message = f"run {plan.run_id} interrupted by {by}; every process of it was stopped"
        return Outcome(exit_code=result.exit_code, state=state, first_failure=failure, message=message,
                       interrupted_by=result.signal, notes=tuple(notes))

    def status(self, run: RunDir) -> RunStatus:
        """run.json, with each node asked for its script's state while the run is marked running,
        and the last metrics line rank 0 wrote."""
        plan, record = run.plan, run.record
        nodes = list(record.nodes) or [NodeStatus(node_rank=n.node_rank, host=n.host, state=NodeState.UNKNOWN)
                                       for n in plan.nodes]
        state = record.state
        live = not state.is_over
        if live:
            nodes = [node.replace(**_poll_node(transport, plan.run_dir, node))
                     for node, transport in zip(nodes, self.transports, strict=True)]
            state = settle([NodeEnd(node_rank=n.node_rank, host=n.host, state=n.state, exit_code=n.exit_code)
                            for n in nodes]).state
        texts = [_read_local(Path(plan.run_dir).expanduser() / "metrics.jsonl")]
        tail = f"tail -n 1 {quote_path(plan.run_dir)}/metrics.jsonl 2>/dev/null"
        if live:
            texts += [_run_quietly(t, tail) for t in self.transports]
        elif not texts[0]:  # an ended run whose directory is not on this machine: node 0's rank 0 wrote it
            texts.append(_run_quietly(self.transports[0], tail, timeout=10))
        return record.status(state=state, last_metrics=last_metrics(texts), nodes=tuple(nodes))

    def checkpoint_steps(self, run: RunDir) -> list[int]:
        """Asked of the nodes in turn (node 0 first: its rank 0 completes every checkpoint) until one answers."""
        errors = []
        for transport in self.transports:
            try:
                _, out, _ = transport.run(marked(complete_steps_command(quote_path(run.plan.run_dir))),
                                          COMMAND_TIMEOUT)
                return parse_steps(after_mark(out))
            except HostError as exc:
                errors.append(exc)
        raise errors[0]

    def read_logs(self, run: RunDir, sink: LineSink, attempt: int | None = None) -> list[str]:
        """Every line of the run, from the merged log kept here, first made whole from the nodes'
        own logs where the live stream did not bring everything (a lost node, a killed launcher, a
        detached run). ``attempt``: an earlier attempt's, from where its files were moved."""
        earlier = attempt not in (None, run.attempt)
        notes = [] if earlier else complete_logs(run, self.transports)
        folder = attempt_folder(attempt) + "/" if earlier else ""
        merged = run.root / folder / "logs" / "merged.log"
        if merged.exists():
            with merged.open(encoding="utf-8", errors="replace") as handle:
                for raw in handle:
                    if match := _MERGED_LINE.match(raw.rstrip("\n")):
                        sink(LogLine.of(int(match["node"]), match["host"], match["text"]))
        return notes

    def stacks(self, run: RunDir, *, flight: bool = False, py_spy: bool = True, native: bool = False
               ) -> list[dict[str, Any]]:
        """Every rank's stack: one command per node, all nodes at once."""
        plan = run.plan

        def one(node_and_transport) -> dict[str, Any]:
            node, transport = node_and_transport
            command = marked(stacks_command(plan.run_dir, plan.run_id, plan.python, str(node.node_rank),
                                            flight=flight, py_spy=py_spy, native=native))
            try:
                status, out, err = transport.run(command, STACKS_TIMEOUT)
                found = answer_of(after_mark(out))
            except HostError as exc:
                return {"host": node.host, "node_rank": node.node_rank, "ranks": [], "error": exc.detail}
            except ValueError:
                why = (err.strip().splitlines() or [f"exit {status}"])[-1]
                return {"host": node.host, "node_rank": node.node_rank, "ranks": [],
                        "error": f"the stack reader failed: {why}"}
            return {**found, "hostname": found.get("host"), "host": node.host, "node_rank": node.node_rank}

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(plan.nodes)))) as pool:
            return list(pool.map(one, zip(plan.nodes, self.transports, strict=True)))

    def fetch(self, run: RunDir, path: str) -> dict[str, list[str]]:
        """Copy ``path`` from every node's run directory into ``runs/<id>/fetched/node<R>/`` here
        (where the run directory is this machine's own, the files are named where they are)."""
        here = Path(run.plan.run_dir).expanduser()
        if here.resolve() == run.root.resolve():
            return {f"node 0 ({run.plan.nodes[0].host})": files_under(here / path, skip=STAGED)}

        def one(node) -> tuple[str, list[str]]:
            label = f"node {node.node_rank} ({node.host})"
            try:
                return label, fetch_from_node(self.transports[node.node_rank], run.plan.run_dir, path,
                                              run.root / "fetched" / f"node{node.node_rank}")
            except HostError as exc:
                return f"{label}: {exc.detail}", []

        with ThreadPoolExecutor(max_workers=max(1, min(32, len(run.plan.nodes)))) as pool:
            return dict(pool.map(one, run.plan.nodes))

    def stop(self, run: RunDir) -> dict[str, str]:
        """End every process of the run on every node and record it as stopped."""
        remaining = stop_run(run.run_id, self.transports)
        nodes = tuple(n.replace(state=NodeState.STOPPED) if n.state in (NodeState.RUNNING, NodeState.STARTING) else n
                      for n in run.record.nodes)
        run.change(state=RunState.STOPPED, nodes=nodes, stopped_at=now(), remaining=remaining)
        return remaining


def _poll_node(transport: Transport, run_dir: str, node: NodeStatus) -> dict[str, Any]:
    """A node's state as its own files say (``exit N``, its wrapper alive, or gone)."""
    try:
        _, out, _ = transport.run(marked(poll_command(run_dir, node.node_rank, node.pid or 0)), COMMAND_TIMEOUT)
    except HostError as exc:
        return {"state": NodeState.UNREACHABLE, "detail": exc.detail}
    answer = parse_poll(after_mark(out))
    if isinstance(answer, Exited):
        return {"exit_code": answer.code, "state": NodeState.SUCCEEDED if answer.code == 0 else NodeState.FAILED}
    return {"state": NodeState.RUNNING if isinstance(answer, Running) else NodeState.GONE}


def _read_local(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def _run_quietly(transport: Transport, command: str, timeout: float = 30) -> str:
    try:
        _, out, _ = transport.run(marked(command), timeout)
    except HostError:
        return ""
    return after_mark(out)


def read_error_file(transport: Transport, path: str) -> str | None:
    """The message of a failed rank's torchelastic error file (written by @record), read on its node."""
    try:
        _, out, _ = transport.run(marked(f"cat {quote_path(path)} 2>/dev/null"), 30)
        message = json.loads(after_mark(out)).get("message", {})
    except (HostError, ValueError, AttributeError):
        return None
    text = message.get("message") if isinstance(message, dict) else message
    return str(text).strip().splitlines()[-1] if text else None
