"""Nodes that fsdpctl starts itself, one connection each: this machine (``local``) or SSH hosts (``ssh``).

Both speak the same node protocol (``commands``) and share the supervisor; a subclass says only
where a run's nodes are (its pure ``placement``) and how one is reached (``open_connection``). A
node owns its connection: it is opened for the node's host when first needed and kept by host, so
an attempt on other hosts than the one before simply reaches those.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Optional, Protocol

from ...bundle import Payload
from ...container.runtime import probe_timeout
from ...environment.held import EnvironmentJudge, node_listing
from ...environment.nodes import make_environments
from ...errors import HostError
from ...hostcheck.checks import DoctorReport, HostReport, probe_budget
from ...hostcheck.fanout import (
    NodeProbe,
    PortSessions,
    ProbeRunner,
    health_args,
    host_python,
    make_jobs,
    run_doctor,
)
from ...hostcheck.probe import container_probe_args
from ...live import layout
from ...live.layout import collector_alive
from ...metrics.gpu_samples import GPU_SAMPLES_SHOWN, newest_samples, newest_text
from ...plan.make import container_plan
from ...plan.types import LaunchPlan, Overrides, Placement, PlanContext
from ...profiles.schema import ClusterProfile, HostSpec
from ...rundir.attempts import attempt_folder
from ...rundir.lines import ranks_in_log, read_merged
from ...rundir.outcome import NodeEnd, settle
from ...rundir.paths import files_under, read_json
from ...rundir.record import now
from ...rundir.rundir import RunDir, last_metrics
from ...rundir.state import NodeState, RunState
from ...rundir.status import NodeStatus, RunStatus
from ...shell import after_mark, marked, quote_path
from ..base import Backend, DoctorRequest, LineSink, Preflight, ProfileProblem, TraceNode
from ..transport import Transport, fan_out, raise_open_files
from .commands import STAGED, Exited, Running, parse_poll, poll_command
from .follow import NodesFollower
from .log_copy import complete_logs, launcher_record
from .rank_calls import clock_offsets, node_profile_request, node_stacks
from .runs import COMMAND_TIMEOUT, fetch_from_node, node_records, stop_run
from .starter import NodeStarter

PREFLIGHT_TIMEOUT = 20.0


class HasHost(Protocol):
    host: str


class NodesBackend(Backend):
    """The node protocol over one connection per node host (opened on first use)."""

    takes_spares = True
    port_check: ClassVar[bool]
    """Whether the rendezvous port can be tried between nodes (not on one machine)."""

    def __init__(self, profile: ClusterProfile, connect: Optional[Callable[[str], Transport]] = None):
        super().__init__(profile)
        self._connect = connect or self.open_connection
        self._connections: dict[str, Transport] = {}
        self._lock = threading.Lock()

    # ---- what a subclass says --------------------------------------------------------------------
    def open_connection(self, host: str) -> Transport:
        """A connection to the node ``host`` (a name from the plan or the profile)."""
        raise NotImplementedError

    # ---- connections -----------------------------------------------------------------------------
    def connection(self, node: HasHost) -> Transport:
        """The node's connection, opened the first time its host is asked for."""
        with self._lock:
            transport = self._connections.get(node.host)
            if transport is None:
                transport = self._connections[node.host] = self._connect(node.host)
        return transport

    def close(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for transport in connections:
            transport.close()

    def _parallel(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        with ThreadPoolExecutor(max_workers=fan_out(len(items))) as pool:
            return list(pool.map(fn, items))

    # ---- checking the nodes ----------------------------------------------------------------------
    def doctor(self, request: DoctorRequest, on_host: Callable[[HostReport], None] | None = None,
               runner: ProbeRunner | None = None, nodes: list[NodeProbe] | None = None,
               master: tuple[int, str] | None = None, python: str | None = None,
               port_sessions: PortSessions | None = None) -> DoctorReport:
        """Probe every node (default: the profile's, as a run would be placed) and diff them."""
        workdir = self.profile.workdir
        if nodes is None or master is None or python is None:
            placed = self.placement(self.profile, Overrides(), PlanContext.here("doctor"))
            nodes = self._probes(placed)
            master = (next(i for i, t in enumerate(placed.nodes) if t.host == placed.master_host), placed.master_addr)
            python, workdir = host_python(self.profile, placed.python), placed.workdir
        # judged in the environment where it is made; launch makes it elsewhere
        judge = EnvironmentJudge(request.environment, workdir, python, nodes) if request.environment else None
        raise_open_files(len(nodes))
        jobs = make_jobs(self.profile, nodes, master[0], master[1], request.port, request.deep,
                         request.port_check and self.port_check, requirements=request.requirements,
                         extra=request.extra)
        timeout = probe_budget(request.timeout, len(nodes), request.port_check)
        report = run_doctor(self.profile, judge.jobs(jobs) if judge else jobs, python=python, timeout=timeout,
                            nproc=request.nproc, concurrency=request.concurrency,
                            on_host=judge.told(on_host) if judge else on_host, runner=runner,
                            port_sessions=port_sessions)
        return judge.finish(report) if judge else report

    def _probes(self, placed: Placement) -> list[NodeProbe]:
        """A probe per placed node, with its own process count and chosen GPUs."""
        return [NodeProbe(rank, self.connection(t), t.interface, t.own_nproc, t.chosen_gpus)
                for rank, t in enumerate(placed.nodes)]

    def check_hosts(self, hosts: Sequence[HostSpec], on_host: Callable[[HostReport], None] | None = None,
                    environment: Any = None) -> DoctorReport:
        """doctor's fast checks on ``hosts`` placed as a run of the profile would place them (in the run's
        ``environment`` where they hold it)."""
        alone = dataclasses.replace(self.profile, hosts=tuple(hosts), spares=(),
                                    rendezvous=dataclasses.replace(self.profile.rendezvous, host=None))
        placed = self.placement(alone, Overrides(), PlanContext.here("check"))
        nodes = self._probes(placed)
        health = self.profile.health  # a spare, or an excluded host put back, has its GPUs asked too
        request = DoctorRequest(port=0, timeout=probe_timeout(container_plan(self.profile), PREFLIGHT_TIMEOUT),
                                port_check=False, environment=environment,
                                extra=health_args(False, health.allow_busy_gpus, health.preflight))
        return self.doctor(request, on_host, nodes=nodes, master=(0, placed.master_addr),
                           python=host_python(self.profile, placed.python))

    def preflight(self, plan: LaunchPlan, payload: Payload,
                  on_host: Callable[[HostReport], None] | None = None) -> Preflight:
        """doctor's fast checks on the plan's own nodes and rendezvous port, answered by the node agents
        that also stage the payload; they wait for ``start`` (one command per node for both)."""
        nproc = int(plan.nproc_per_node) if plan.nproc_per_node.isdigit() else None
        request = DoctorRequest(port=plan.master_port, timeout=probe_timeout(plan.container, PREFLIGHT_TIMEOUT),
                                nproc=nproc,
                                port_check=plan.num_nodes > 1, requirements=plan.requirements,
                                extra={**health_args(False, plan.allow_busy_gpus, plan.gpu_health),
                                       **container_args(plan)})
        starter = NodeStarter(plan, payload, self.connection, plan.host_python)
        nodes = [NodeProbe(n.node_rank, self.connection(n), n.interface, int(n.nproc) if n.nproc.isdigit() else None,
                           n.gpus) for n in plan.nodes]
        master = next(n.node_rank for n in plan.nodes if n.host == plan.master_host)
        report = self.doctor(request, on_host, runner=starter.probe_runner(), nodes=nodes,
                             master=(master, plan.master_addr), python=plan.host_python,
                             port_sessions=starter.port_sessions())
        answered = [span[1] for span in starter.timeline.spans.get("probe", {}).values()]
        if answered:  # judged once the last probe answered
            starter.timeline.begin("parity", at=starter.timeline.origin + max(answered))
            starter.timeline.end("parity")
        return Preflight(report, staged=starter)

    def make_environment(self, plan: LaunchPlan, on_bytes: Callable[[int, int], None] | None = None,
                         on_node: Callable[[Any], None] | None = None) -> list[Any]:
        return make_environments(plan.environment, [(n.node_rank, n.host, self.connection(n)) for n in plan.nodes],
                                 on_bytes=on_bytes, on_node=on_node)

    def node_environments(self, environment: Any, *, prune: bool, keep: int) -> list[dict[str, Any]]:
        placed = self.placement(self.profile, Overrides(), PlanContext.here("env"))
        return node_listing(environment, placed.workdir, placed.python,
                            [(rank, t.host, self.connection(t)) for rank, t in enumerate(placed.nodes)], prune, keep)

    # ---- a run -----------------------------------------------------------------------------------
    def start(self, run: RunDir, payload: Payload, *, detached: bool,
              preflight: Optional[Preflight] = None) -> NodesFollower:
        """Start every node (staging it too, unless the preflight did), and record their process ids."""
        staged = preflight.staged if preflight is not None else None
        reuse = isinstance(staged, NodeStarter) and staged.plan.run_id == run.run_id \
            and staged.plan.attempt == run.attempt
        raise_open_files(run.plan.num_nodes)
        starter = staged if reuse else NodeStarter(run.plan, payload, self.connection, run.plan.host_python)
        if staged is not None and staged is not starter:
            staged.close()
        # A foreground run's agents stay on to watch over their nodes for this process; a detached
        # run is meant to outlive it, and its agents leave.
        started = starter.start(watch=0.0 if detached else float(run.plan.node_timeout))
        run.change(state=RunState.RUNNING, nodes=node_records(started), started_at=now(), detached=detached,
                   launcher=None if detached else launcher_record())
        world = run.plan.world_size or "from GPU count"
        return NodesFollower(run, started, f"started on {run.plan.num_nodes} node(s), world size {world}",
                             self.connection)

    def attach(self, run: RunDir, *, collect: bool = False) -> NodesFollower:
        return NodesFollower(run, None, "", self.connection, collect=collect)

    def status(self, run: RunDir) -> RunStatus:
        """run.json, with how each node stands now: from the run's collector (the launcher or a
        detached run's follower, which writes it here every second) while one follows the run, else
        asked of each node while the run is marked running; the last metrics line rank 0 wrote and
        the newest GPU samples, from the copies here (else from the nodes)."""
        plan, record = run.plan, run.record
        nodes = list(record.nodes) or [NodeStatus(node_rank=n.node_rank, host=n.host, address=n.address,
                                                  state=NodeState.UNKNOWN) for n in plan.nodes]
        state = record.state
        followed = not state.is_over and bool(collector_alive(run.root))
        live = not state.is_over and not followed
        if followed:
            nodes = followed_nodes(run, nodes)
        if live:
            nodes = self._parallel(lambda node: node.replace(**self._poll_node(plan.run_dir, node)), nodes)
            state = settle([NodeEnd(node_rank=n.node_rank, host=n.host, state=n.state, exit_code=n.exit_code)
                            for n in nodes]).state
        texts = [newest_text(path) for path in layout.metrics_files(run.root, plan)]
        gpus = [newest_text(path) for path in layout.gpu_files(run.root, plan)]
        tail = "tail -n 5 metrics.jsonl 2>/dev/null"  # the last training row may be followed by a validation row
        if live:  # and each node's newest GPU samples (a straggler's cause needs a few), and its ranks' rows
            answers = self._parallel(lambda node: self._quietly(
                node, plan.run_dir, f"{tail}; tail -n 2 {layout.telemetry_name(node.node_rank)} 2>/dev/null; "
                                    f"echo {_GPU_MARK}; tail -n {GPU_SAMPLES_SHOWN} "
                                    f"gpu/node{node.node_rank}.jsonl 2>/dev/null"), list(plan.nodes))
            # the nodes' own word first: copies here nobody collects any more may be behind
            texts = [answer.partition(_GPU_MARK)[0] for answer in answers] + texts
            asked = [answer.partition(_GPU_MARK)[2] for answer in answers]
            gpus = asked if any(asked) else gpus
        elif not any(texts) and plan.nodes and not followed:
            # an ended run whose metrics were not collected here: node 0's rank 0 wrote them
            texts.append(self._quietly(plan.nodes[0], plan.run_dir, tail, timeout=10))
        nodes = [n if n.ranks else n.replace(ranks=ranks_in_log(run.paths.logs / f"node{n.node_rank}.log"))
                 for n in nodes]  # the global ranks each node's rank 0 said it holds, in the copy kept here
        return record.status(state=state, last_metrics=last_metrics(texts), nodes=tuple(nodes),
                             gpu_samples=newest_samples(gpus))

    def ask(self, run: RunDir, command: str) -> str:
        """Asked of the nodes in turn (node 0 first: its rank 0 completes every checkpoint) until one answers."""
        errors: list[HostError] = []
        for node in run.plan.nodes:
            try:
                _, out, _ = self.connection(node).run(marked(f"cd {quote_path(run.plan.run_dir)} && {command}"),
                                                      COMMAND_TIMEOUT)
                return after_mark(out)
            except HostError as exc:
                errors.append(exc)
        raise errors[0]

    def read_logs(self, run: RunDir, sink: LineSink, attempt: int | None = None) -> list[str]:
        """Every line of the run, from the merged log kept here, first made whole from the nodes'
        own logs where the live stream did not bring everything (a lost node, a killed launcher, a
        detached run). ``attempt``: an earlier attempt's, from where its files were moved."""
        earlier = attempt not in (None, run.attempt)
        notes = [] if earlier else complete_logs(run, self.connection)
        folder = run.root / attempt_folder(attempt) if earlier else run.root
        plan = run.plan
        if earlier:
            from ...plan.types import plan_from_json
            from ...rundir.paths import read_json

            plan = plan_from_json(read_json(folder / "plan.json")) if (folder / "plan.json").exists() else plan
        read_merged(folder / "logs" / "merged.log", plan, sink)
        return notes

    def stacks(self, run: RunDir, *, flight: bool = False, py_spy: bool = True, native: bool = False
               ) -> list[dict[str, Any]]:
        """Every rank's stack: one command per node, all nodes at once."""
        return node_stacks(self, run, flight=flight, py_spy=py_spy, native=native)

    def profile_request(self, run: RunDir, request: str, ranks: str) -> list[dict[str, Any]]:
        """The request handed to the chosen ranks: one command per node, all nodes at once."""
        return node_profile_request(self, run, request, ranks)

    def clock_offsets(self, run: RunDir) -> dict[str, dict[str, Any]]:
        """Each node's clock against this machine's (none to measure where the nodes are this machine)."""
        if self.name == "local":
            return {node.host: {"offset_ns": 0, "error_ns": 0} for node in run.plan.nodes}
        return clock_offsets(self, run)

    def fetch(self, run: RunDir, path: str) -> dict[str, list[str]]:
        """Copy ``path`` from every node's run directory into ``runs/<id>/fetched/node<R>/`` here
        (where the run directory is this machine's own, the files are named where they are)."""
        here = Path(run.plan.run_dir).expanduser()
        if here.resolve() == run.root.resolve():
            return {f"node 0 ({run.plan.nodes[0].host})": files_under(here / path, skip=STAGED)}

        def one(node) -> tuple[str, list[str]]:
            label = f"node {node.node_rank} ({node.host})"
            try:
                return label, fetch_from_node(self.connection(node), run.plan.run_dir, path,
                                              run.root / "fetched" / f"node{node.node_rank}")
            except HostError as exc:
                return f"{label}: {exc.detail}", []

        return dict(self._parallel(one, list(run.plan.nodes)))

    def stop(self, run: RunDir, grace: Optional[int] = None, stop_signal: Optional[str] = None) -> dict[str, str]:
        """End every process of the run on every node and record it as stopped: the ranks get the stop
        signal first and the grace to save and exit by themselves (``kill_command``). The stop is
        recorded before the signal goes: a launcher that follows the run records its end as stopped,
        not as a success or a failure of its own."""
        plan, record = run.plan, run.record
        container = plan.container
        live = not record.state.is_over
        if live:
            run.change(stopped_at=now())
        remaining = stop_run(run.run_id, [self.connection(n) for n in plan.nodes],
                             plan.stop_grace if grace is None else grace, container.runtime if container else None,
                             stop_signal or plan.stop_signal, plan.run_dir)
        record = run.record
        if not live or (record.state.is_over and record.state is not RunState.STOPPED):
            # it had ended already, by itself: what ended it stays its record
            run.change(remaining=remaining)
            return remaining
        nodes = tuple(n.replace(state=NodeState.STOPPED) if n.state in (NodeState.RUNNING, NodeState.STARTING) else n
                      for n in record.nodes)
        run.change(state=RunState.STOPPED, nodes=nodes, stopped_at=record.stopped_at or now(), remaining=remaining,
                   stop_checkpoint=self.stop_checkpoint(run))
        return remaining

    def trace_node(self) -> Optional[TraceNode]:
        """The profile's first node, as a run would be placed."""
        placed = self.placement(self.profile, Overrides(), PlanContext.here("trace"))
        if not placed.nodes:
            return None
        first = placed.nodes[0]
        return TraceNode(first.host, self.connection(first), placed.python)

    # ---- helpers ---------------------------------------------------------------------------------
    def _poll_node(self, run_dir: str, node: NodeStatus) -> dict[str, Any]:
        """A node's state as its own files say (``exit N``, its wrapper alive, or gone)."""
        try:
            _, out, _ = self.connection(node).run(marked(poll_command(run_dir, node.node_rank, node.pid or 0)),
                                                  COMMAND_TIMEOUT)
        except HostError as exc:
            return {"state": NodeState.UNREACHABLE, "detail": exc.detail}
        answer = parse_poll(after_mark(out))
        if isinstance(answer, Exited):
            return {"exit_code": answer.code, "state": NodeState.SUCCEEDED if answer.code == 0 else NodeState.FAILED}
        return {"state": NodeState.RUNNING if isinstance(answer, Running) else NodeState.GONE}

    def _quietly(self, node: HasHost, run_dir: str, command: str, timeout: float = 30) -> str:
        try:
            _, out, _ = self.connection(node).run(marked(f"cd {quote_path(run_dir)} 2>/dev/null && {command}"),
                                                  timeout)
        except HostError:
            return ""
        return after_mark(out)


_GPU_MARK = "--fsdpctl-gpu-samples--"


def pyxis_problem(profile: ClusterProfile) -> ProfileProblem | None:
    """Pyxis is Slurm's: hosts reached directly start their containers with another runtime."""
    if profile.container is not None and profile.container.runtime == "pyxis":
        return ("container.runtime", "pyxis starts containers through Slurm's srun only",
                "use docker, podman or apptainer on these hosts, or backend: slurm")
    return None


def container_args(plan: LaunchPlan) -> dict[str, Any]:
    """The preflight's container part, from the plan (its image may be ``--container``'s)."""
    if plan.container is None:
        return {}
    return {"container": container_probe_args(plan.container, plan.python)}


def followed_nodes(run: RunDir, nodes: list[NodeStatus]) -> list[NodeStatus]:
    """The nodes as the run's collecting follower last said they stand (``live/follower.json``)."""
    said = read_json(layout.live_dir(run.root) / layout.FOLLOWER)
    if said.get("attempt") != run.plan.attempt:
        return nodes
    now = {n.get("node_rank"): n for n in said.get("nodes") or []}
    out = []
    for node in nodes:
        mine = now.get(node.node_rank)
        if mine:
            node = node.replace(state=NodeState.parse(mine.get("state")), exit_code=mine.get("exit_code"),
                                detail=mine.get("detail") or node.detail)
        out.append(node)
    return out
