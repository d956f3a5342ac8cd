"""``run.json`` as a type: what a run is, how it stands, each node's part, its earlier attempts.

``RunRecord`` is the one shape of the file. It is written by ``RunDir.change`` alone (one writer,
serialised between processes) and read back by ``from_json``, which also reads what older fsdpctl
versions wrote. What only a backend knows of a run (a scheduler's job id, its own words for the
job's state) is kept in ``job``, written at the top level of the file beside the common fields.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .state import Failure, Outcome, RunState
from .status import AttemptInfo, NodeStatus, Recovery, Replacement, Resize, RunStatus, attempt_changes


def now() -> str:
    """The time, as run.json records it."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def epoch(stamp: Optional[str]) -> Optional[float]:
    """A time as run.json records it, in seconds since the epoch (None: none, or not such a time)."""
    if not stamp:
        return None
    try:
        return _dt.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, kw_only=True)
class Launcher:
    """The process that streams a foreground run's logs into its directory."""

    host: str
    pid: int

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "pid": self.pid}


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A run as run.json keeps it. Every field but the first three has a default: a record is made
    with what is known when the run is created, and each change replaces the fields it knows."""

    run_id: str
    profile: str
    backend: str
    """The backend that runs it (a name in the backend registry)."""
    state: RunState = RunState.STARTING
    attempt: int = 1
    run_dir_on_nodes: str = ""
    num_nodes: int = 0
    world_size: Optional[int] = None
    secrets: tuple[str, ...] = ()
    """The names of the variables the ranks get as secrets; their values are written nowhere."""
    nodes: tuple[NodeStatus, ...] = ()
    """The nodes of this attempt: host, address, node rank, process id, state, exit code."""
    created_at: Optional[str] = None
    started_at: Optional[str] = None
    submitted_at: Optional[str] = None
    """When a scheduler took the run (it starts when the scheduler allocates its nodes)."""
    finished_at: Optional[str] = None
    stopped_at: Optional[str] = None
    """When ``fsdpctl stop`` ended it."""
    resumed_at: Optional[str] = None
    exit_code: Optional[int] = None
    first_failure: Optional[Failure] = None
    detached: bool = False
    """No launcher follows it as its owner (``--detach``, or a scheduler's job): whoever follows it
    records how it ended, and acts on a hang."""
    launcher: Optional[Launcher] = None
    logs_complete: bool = False
    """The copies of the nodes' logs here are whole: nothing is asked of the nodes again."""
    remaining: Mapping[str, str] = field(default_factory=dict)
    """After a stop: per host, the processes that were left (empty: none)."""
    from_step: Optional[int] = None
    """The checkpoint step this attempt continued from (the bundled workload)."""
    attempts: tuple[AttemptInfo, ...] = ()
    """The earlier attempts, oldest first."""
    replacements: tuple[Replacement, ...] = ()
    """Spares this attempt runs on in the place of excluded hosts (which host, by which, why)."""
    recovery: Optional[Recovery] = None
    """How long the run stood still from the last attempt's failure to this one's first step, and
    how many steps it trains again."""
    timeline: Optional[Mapping[str, Any]] = None
    """Where this attempt's seconds went: each phase, per node (``rundir.timeline``)."""
    resize: Optional[Resize] = None
    """This attempt runs on another number of nodes than the one before (``elastic``)."""
    restart: Optional[Mapping[str, Any]] = None
    """This attempt failed: why it was or was not started again (``fsdpctl.api.restart_causes.Verdict``)."""
    stop_checkpoint: Optional[int] = None
    """Stopped: the step of the checkpoint the bundled workload saved at its end (``fsdpctl.api.stopping``)."""
    notes: tuple[str, ...] = ()
    """What went wrong beside the run, one line each, kept across attempts (a notice not sent)."""
    job: Mapping[str, Any] = field(default_factory=dict)
    """What the backend keeps of the run (Slurm: ``job_id``, ``via``, ``slurm_output``, ``slurm_state``)."""

    def replace(self, **changes: Any) -> RunRecord:
        """The record with ``changes``; ``job`` changes are merged into the backend's fields."""
        if "job" in changes:
            changes["job"] = {**self.job, **changes["job"]}
        return dataclasses.replace(self, **changes)

    @property
    def job_id(self) -> Optional[str]:
        """The scheduler's id of the run's job, for a run a scheduler runs."""
        value = self.job.get("job_id")
        return None if value is None else str(value)

    def node(self, node_rank: int) -> Optional[NodeStatus]:
        return next((n for n in self.nodes if n.node_rank == node_rank), None)

    def next_attempt(self, attempt: int, from_step: Optional[int], when: str) -> RunRecord:
        """The record of the run's next attempt: this one summed up in ``attempts``, and nothing of
        what described it (its state, exit, nodes, the backend's job) carried over."""
        return RunRecord(run_id=self.run_id, profile=self.profile, backend=self.backend, attempt=attempt,
                         run_dir_on_nodes=self.run_dir_on_nodes, num_nodes=self.num_nodes,
                         world_size=self.world_size, secrets=self.secrets, created_at=self.created_at,
                         attempts=(*self.attempts, self.summary()), from_step=from_step, resumed_at=when,
                         notes=self.notes)

    def summary(self) -> AttemptInfo:
        """This attempt as the next one's history keeps it."""
        failure = self.first_failure
        return AttemptInfo(attempt=self.attempt, state=self.state, exit_code=self.exit_code,
                           from_step=self.from_step, ended_by=failure.describe() if failure else None,
                           started_at=self.started_at or self.submitted_at, finished_at=self.finished_at,
                           job_id=self.job_id, nodes=self.nodes, replacements=self.replacements,
                           recovery=self.recovery, timeline=self.timeline, resize=self.resize, restart=self.restart)

    def recoveries(self) -> tuple[str, ...]:
        """Each attempt's spares and what its restart cost, in a line ("attempt 2: n4 in the place of
        n2 (lost: ...); stood still 21.3 s, 5 step(s) done again"), for those that had either."""
        every = [*((a.attempt, a.replacements, a.recovery, a.resize) for a in self.attempts),
                 (self.attempt, self.replacements, self.recovery, self.resize)]
        return tuple(f"attempt {n}: {attempt_changes(r, c, z)}" for n, r, c, z in every if r or c or z)

    def outcome(self) -> Outcome:
        """How the run ended, as recorded (for a run that has ended)."""
        code = self.exit_code
        if not isinstance(code, int):
            code = 0 if self.state is RunState.SUCCEEDED else 1
        return Outcome(exit_code=code, state=self.state, first_failure=self.first_failure)

    def status(self, **changes: Any) -> RunStatus:
        """The run's status as recorded, with ``changes`` (what was just asked of its nodes or scheduler)."""
        values: dict[str, Any] = {
            "run_id": self.run_id, "state": self.state, "exit_code": self.exit_code, "nodes": self.nodes,
            "first_failure": self.first_failure, "attempt": self.attempt, "from_step": self.from_step,
            "attempts": self.attempts, "job": {"job_id": self.job_id} if self.job_id else {},
            "replacements": self.replacements, "recovery": self.recovery, "resize": self.resize,
            "restart": self.restart, "stop_checkpoint": self.stop_checkpoint, "notes": self.notes,
        }
        values.update(changes)
        return RunStatus(**values)

    def to_json(self) -> dict[str, Any]:
        """The file's content: the common fields, then the backend's."""
        data: dict[str, Any] = {
            "run_id": self.run_id, "profile": self.profile, "backend": self.backend, "state": str(self.state),
            "run_dir_on_nodes": self.run_dir_on_nodes, "num_nodes": self.num_nodes, "world_size": self.world_size,
            "attempt": self.attempt,
        }
        if self.secrets:
            data["secrets"] = {name: "<secret>" for name in self.secrets}
        data["nodes"] = [n.to_json() for n in self.nodes]
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None and value is not False and value != {}:
                data[name] = value
        if self.first_failure is not None:
            data["first_failure"] = self.first_failure.to_json()
        if self.launcher is not None:
            data["launcher"] = self.launcher.to_json()
        if self.attempts:
            data["attempts"] = [a.to_json() for a in self.attempts]
        if self.remaining:
            data["remaining"] = dict(self.remaining)
        if self.replacements:
            data["replacements"] = [r.to_json() for r in self.replacements]
        if self.recovery is not None:
            data["recovery"] = self.recovery.to_json()
        if self.resize is not None:
            data["resize"] = self.resize.to_json()
        if self.notes:
            data["notes"] = list(self.notes)
        data.update({k: v for k, v in self.job.items() if k not in data})
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, run_id: str, profile: str, backend: str) -> RunRecord:
        """run.json as any fsdpctl version wrote it (``run_id``, ``profile``, ``backend``: the plan's,
        for a file written before they were recorded, or not written yet)."""
        launcher = data.get("launcher") if isinstance(data.get("launcher"), Mapping) else None
        secrets = data.get("secrets") or ()
        values = {name: data.get(name) for name in _OPTIONAL if name not in ("detached", "logs_complete")}
        return cls(
            run_id=str(data.get("run_id") or run_id), profile=str(data.get("profile") or profile),
            backend=str(data.get("backend") or backend), state=RunState.parse(data.get("state") or "starting"),
            attempt=int(data.get("attempt") or 1), run_dir_on_nodes=str(data.get("run_dir_on_nodes") or ""),
            num_nodes=int(data.get("num_nodes") or 0), world_size=data.get("world_size"),
            secrets=tuple(secrets), nodes=tuple(NodeStatus.from_json(n) for n in data.get("nodes") or ()),
            first_failure=Failure.from_json(data.get("first_failure")),
            launcher=Launcher(host=str(launcher.get("host")), pid=int(launcher.get("pid") or 0)) if launcher else None,
            remaining=dict(data.get("remaining") or {}),
            attempts=tuple(AttemptInfo.from_json(a) for a in data.get("attempts") or ()),
            replacements=tuple(Replacement.from_json(r) for r in data.get("replacements") or ()),
            recovery=Recovery.from_json(data.get("recovery")), resize=Resize.from_json(data.get("resize")),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            job={k: v for k, v in data.items() if k not in _KNOWN}, detached=bool(data.get("detached")),
            logs_complete=bool(data.get("logs_complete")), **values,
        )


# Plain optional fields, written when set.
_OPTIONAL = ("created_at", "started_at", "submitted_at", "finished_at", "stopped_at", "resumed_at", "exit_code",
             "from_step", "detached", "logs_complete", "timeline", "restart", "stop_checkpoint")
_KNOWN = {f.name for f in dataclasses.fields(RunRecord)} - {"job"}
