"""How a run stands now, as ``status`` shows it and the API returns it: the run's state, each node's,
every attempt, the first failure, the newest metrics line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from .state import Failure, NodeState, RunState


@dataclass(frozen=True, kw_only=True)
class NodeStatus:
    """One node's part of the run."""

    node_rank: int
    host: str
    state: NodeState
    exit_code: Optional[int] = None
    pid: Optional[int] = None
    detail: Optional[str] = None
    """Why it is unreachable, when it is."""

    def to_json(self) -> dict[str, Any]:
        data = {"node_rank": self.node_rank, "host": self.host, "state": str(self.state), "exit_code": self.exit_code}
        if self.pid:
            data["pid"] = self.pid
        if self.detail:
            data["detail"] = self.detail
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeStatus:
        return cls(node_rank=int(data.get("node_rank", 0)), host=str(data.get("host", "?")),
                   state=NodeState.parse(data.get("state")), exit_code=data.get("exit_code"),
                   pid=data.get("pid") or None, detail=data.get("detail"))


@dataclass(frozen=True, kw_only=True)
class AttemptInfo:
    """An earlier attempt of the run, as run.json's ``attempts`` keeps it."""

    attempt: int
    state: RunState
    exit_code: Optional[int] = None
    from_step: Optional[int] = None
    """The checkpoint step it continued from (the bundled workload)."""
    ended_by: Optional[str] = None
    """Its failure in a few words."""
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    job_id: Optional[str] = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptInfo:
        return cls(attempt=int(data.get("attempt", 0)), state=RunState.parse(data.get("state")),
                   exit_code=data.get("exit_code"), from_step=data.get("from_step"), ended_by=data.get("ended_by"),
                   started_at=data.get("started_at") or data.get("submitted_at"),
                   finished_at=data.get("finished_at"), job_id=data.get("job_id"))

    def to_json(self) -> dict[str, Any]:
        data = {"attempt": self.attempt, "state": str(self.state), "exit_code": self.exit_code,
                "from_step": self.from_step, "ended_by": self.ended_by, "started_at": self.started_at,
                "finished_at": self.finished_at, "job_id": self.job_id}
        return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """A run as it stands: asked of its nodes or its scheduler while it is live, else as recorded."""

    run_id: str
    state: RunState
    exit_code: Optional[int] = None
    nodes: tuple[NodeStatus, ...] = ()
    first_failure: Optional[Failure] = None
    last_metrics: Optional[dict[str, Any]] = None
    """The newest training metrics line rank 0 wrote (step, loss, ...)."""
    attempt: int = 1
    from_step: Optional[int] = None
    """The checkpoint step this attempt continued from."""
    attempts: tuple[AttemptInfo, ...] = ()
    """The earlier attempts, oldest first."""
    job_id: Optional[str] = None
    """Slurm's job id, for a Slurm run."""
    slurm_state: Optional[str] = None
    restarts: Optional[int] = None
    """How often Slurm requeued the job."""

    def to_json(self) -> dict[str, Any]:
        """The documented ``status --json`` form."""
        data: dict[str, Any] = {
            "run_id": self.run_id, "state": str(self.state), "exit_code": self.exit_code,
            "nodes": [n.to_json() for n in self.nodes],
            "first_failure": self.first_failure.to_json() if self.first_failure else None,
            "last_metrics": self.last_metrics, "attempt": self.attempt, "from_step": self.from_step,
            "attempts": [a.to_json() for a in self.attempts],
        }
        for name in ("job_id", "slurm_state", "restarts"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data


def recorded_status(record: Mapping[str, Any], run_id: str, **changes: Any) -> RunStatus:
    """A run's status as run.json records it, with ``changes`` (what was just asked of its nodes)."""
    values: dict[str, Any] = {
        "run_id": run_id, "state": RunState.parse(record.get("state")), "exit_code": record.get("exit_code"),
        "nodes": tuple(NodeStatus.from_json(n) for n in record.get("nodes") or ()),
        "first_failure": Failure.from_json(record.get("first_failure")), "attempt": record.get("attempt", 1),
        "from_step": record.get("from_step"),
        "attempts": tuple(AttemptInfo.from_json(a) for a in record.get("attempts") or ()),
        "job_id": record.get("job_id"),
    }
    values.update(changes)
    return RunStatus(**values)
