"""Stage and start a plan's nodes through the node agent: one command per node, preflight included.

With a preflight, each node's agent unpacks the payload, answers the probe and waits; once every
node's answer is judged, the launcher says ``go`` on each open session and the nodes start at once.
A launch that stops at the preflight closes the sessions instead: the agents remove what they staged.

From the moment a node's payload is sent until the launch's follower takes over, its agent hears a
heartbeat every few seconds: staging a thousand nodes from one launcher takes longer than the node
timeout, and an agent that heard nothing for that long would take the launcher for gone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...bundle import Payload
from ...container.runtime import cleanup_command, probe_timeout
from ...errors import HostError
from ...hostcheck.fanout import HostJob, ProbeRunner
from ...hostcheck.probe_script import END
from ...live.collector import side_specs
from ...plan.types import LaunchPlan, NodeSpec
from ...rundir.attempts import attempt_folder, node_files
from ...rundir.state import NodeState
from ...rundir.timeline import timeline_for
from ...shell import OUTPUT_MARK, marked
from ..transport import Session, Transport, fan_out
from .agent import GO, HEARTBEAT, heartbeat_seconds
from .commands import AGENT_REFUSED, AGENT_STARTED, agent_command
from .runs import COMMAND_TIMEOUT, NodeRun, stop_run

GO_TIMEOUT = 120.0
"""How long a staged agent waits for the launcher's word before it gives up (and cleans up)."""


class NodeStarter:
    """The agents of one launch: opened by the preflight (or by ``start`` without one)."""

    def __init__(self, plan: LaunchPlan, payload: Payload, connect: Callable[[NodeSpec], Transport], python: str):
        self.plan, self.payload, self.connect, self.python = plan, payload, connect, python
        self.nodes = {node.node_rank: node for node in plan.nodes}
        self.sessions: dict[int, Session] = {}
        self.beating: dict[int, Session] = {}
        """Agents sent their whole payload and not yet followed: they hear ``hb`` until ``close``."""
        self.quiet = threading.Event()
        self.beats = threading.Thread(target=self._beat, daemon=True)
        self.beats_lock = threading.Lock()
        """Held to start ``beats`` once: the nodes' threads reach ``_keep_alive`` together."""
        self.timeline = timeline_for(plan.run_id, plan.attempt)
        self.budget = COMMAND_TIMEOUT + 0.5 * len(plan.nodes)
        """Seconds a node may take to be staged and started: more with more nodes, all sent their
        payload by this one process (at 256 nodes on a small launcher, 30 s was not enough)."""

    def _agent(self, rank: int, probe: dict[str, Any] | None, timeout: float) -> Session:
        """The node's agent, its payload sent; what a chatty shell rc printed before it is read past."""
        secrets = self.payload.secret_blob()
        files = self.payload.files.for_node(f"node{rank}.sh")
        args = {"run_id": self.plan.run_id, "run_dir": self.plan.run_dir, "rank": rank, "attempt": self.plan.attempt,
                "bytes": len(files),  # the tar's size, known before it is made
                "secret_bytes": len(secrets), "probe": probe,
                # the others' probes may be pulling the image: wait as long as the slowest may take
                "go_timeout": probe_timeout(self.plan.container, GO_TIMEOUT)}
        args["stop"] = [f"SIG{self.plan.stop_signal}", self.plan.stop_grace]  # what a stop gives the ranks
        if self.plan.container is not None:  # its containers are removed whenever this agent ends the node
            args["cleanup"] = cleanup_command(self.plan.container.runtime, self.plan.run_id, rank)
        if self.plan.attempt > 1:  # the last attempt's node files move aside when this one starts
            args["archive"] = {"to": attempt_folder(self.plan.attempt - 1), "names": node_files(rank)}
        side = side_specs(Path(self.plan.local_run_dir), self.plan, rank, self.nodes[rank].host)
        if side:  # its metrics and GPU samples come with its log, to the collector here
            args["side"] = side
        transport = self.connect(self.nodes[rank])
        opening = getattr(transport, "connect", None)  # a connection of its own (SSH): timed apart
        if opening is not None:
            with self.timeline.span("connect", rank):
                opening()
            drops = getattr(transport, "drops", None)
            if drops:  # its sshd dropped the connection (MaxStartups) and it was tried again: when
                self.timeline.begin("dropped", rank, at=drops[0])
                self.timeline.end("dropped", rank, at=drops[-1])
        with self.timeline.span("stage", rank):
            session = transport.session(marked(agent_command(self.python, args)))
            self.sessions[rank] = session
            for chunk in files.chunks():  # the tar as it is made: never all of it in memory
                session.send(chunk)
            session.send(secrets)
            self._keep_alive(rank, session)
            session.read_until(OUTPUT_MARK, timeout)
        reopened = getattr(getattr(transport, "channels", None), "retries", None)
        if reopened:  # its session timed out opening (a loaded launcher or node) and was opened again
            self.timeline.begin("reopened", rank, at=reopened[0])
            self.timeline.end("reopened", rank, at=reopened[-1])
        return session

    def _keep_alive(self, rank: int, session: Session) -> None:
        """Heartbeats to this agent from now on (its payload is out: they come after its last byte)."""
        self.beating[rank] = session
        # Under a lock: two threads that both saw it not alive both started it, and the second OS thread
        # printed CPython's "Exception ignored in thread started by" traceback (a KeyError in _limbo).
        with self.beats_lock:
            if self.beats.ident is None and not self.quiet.is_set():
                self.beats.start()

    def _beat(self) -> None:
        every = heartbeat_seconds(self.plan.node_timeout)
        while not self.quiet.wait(every):
            for session in self.beating.copy().values():  # dict.copy holds the GIL: nodes join as it goes
                try:
                    session.send(f"{HEARTBEAT}\n".encode())
                except (HostError, OSError):
                    pass  # the agent has ended: reading its session says why

    def port_sessions(self) -> AgentSessions:
        """Where the preflight's port round asks each node: its agent, which answered the probe and
        now waits for ``start``."""
        return AgentSessions(self.sessions)

    def probe_runner(self) -> ProbeRunner:
        """Runs each node's preflight probe inside its agent, which then waits for ``start``."""
        def run(job: HostJob, timeout: float) -> tuple[int, str, str]:
            session = self._agent(job.node_rank, job.args, timeout)
            with self.timeline.span("probe", job.node_rank):
                out = session.read_until(END, timeout)
            if END in out:
                return 0, out, ""
            self.sessions.pop(job.node_rank, None)
            self.beating.pop(job.node_rank, None)
            status, rest, err = session.finish(timeout)  # it ended before answering: say why
            return status, out + rest, err
        return run

    def start(self, watch: float) -> list[NodeRun]:
        """Start every node (those the preflight staged, on their word); raises HostError, after
        stopping the nodes that did start (they must not run on alone). ``watch``: the node timeout
        of a foreground run, whose agents stay to watch over their nodes (their sessions are kept
        in the returned NodeRuns); 0 for a detached run, whose agents leave."""
        runs = [NodeRun(node, self.connect(node)) for node in self.plan.nodes]

        def start_one(run: NodeRun) -> None:
            session = self.sessions.get(run.rank) or self._agent(run.rank, None, self.budget)
            with self.timeline.span("agents", run.rank):
                session.send(f"{GO} {watch:g}\n".encode())
                out = session.read_until(AGENT_STARTED, self.budget)
            words = out.rsplit(AGENT_STARTED, 1)[-1].split() if AGENT_STARTED in out else []
            if words and words[0].isdigit() and watch > 0:
                run.pid, run.state, run.session = int(words[0]), NodeState.RUNNING, session
                self.sessions.pop(run.rank, None)  # the run's now: closed when following ends
                return
            self.beating.pop(run.rank, None)
            status, rest, err = session.finish(COMMAND_TIMEOUT)
            self.sessions.pop(run.rank, None)
            if status != 0 or not words or not words[0].isdigit():
                said = (err.strip() or (out + rest).replace(AGENT_REFUSED, "").strip() or f"exit {status}")
                raise HostError(run.node.host, "start", f"could not stage or start the node script in "
                                f"{self.plan.run_dir}: {said.splitlines()[-1]}",
                                "check that workdir can be written there, and run the node script by hand to see why")
            run.pid, run.state = int(words[0]), NodeState.RUNNING

        try:
            with ThreadPoolExecutor(max_workers=fan_out(len(runs))) as pool:
                list(pool.map(start_one, runs))
        except HostError:
            for run in runs:
                if run.session is not None:
                    run.session.close()
            stop_run(self.plan.run_id, [run.transport for run in runs],
                     runtime=self.plan.container.runtime if self.plan.container else None)
            raise
        finally:
            self.close()
        return runs

    def close(self) -> None:
        """Close what is still open: an agent that never heard ``go`` starts nothing and cleans up. The
        heartbeats stop: a started node's are the follower's from now on."""
        self.quiet.set()
        self.beating.clear()
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()


class AgentSessions:
    """The port round's sessions in a launch: the node agents, kept open for ``start``."""

    def __init__(self, sessions: dict[int, Session]):
        self.sessions = sessions

    def open(self, job: HostJob) -> Session:
        session = self.sessions.get(job.node_rank)
        if session is None:
            raise HostError(job.transport.host, "probe", "its agent has ended", "look at the node's own line")
        return session

    def done(self, job: HostJob, session: Session) -> None:
        """The agent stays: it waits for ``start``."""
