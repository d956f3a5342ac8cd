"""How a run stands now, as ``status`` shows it and the API returns it: the run's state, each node's,
every attempt, the first failure, the newest metrics line."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from .state import Failure, NodeState, RunState


@dataclass(frozen=True, kw_only=True)
class NodeStatus:
    """One node's part of the run."""

    node_rank: int
    host: str
    """How fsdpctl reaches the node."""
    state: NodeState
    exit_code: Optional[int] = None
    pid: Optional[int] = None
    detail: Optional[str] = None
    """Why it is unreachable, when it is."""
    address: Optional[str] = None
    """How the other nodes reach it, when fsdpctl knows."""
    log_bytes: int = 0
    """Bytes of its log that reached the launcher."""
    signal: Optional[int] = None
    """The signal that ended a rank there, when one did (the spare-node rule reads it)."""
    stopped: bool = False
    """fsdpctl ended it because another node had failed."""
    ranks: Optional[str] = None
    """The global ranks it holds (``0-7``), as its local rank 0 said: the rendezvous decides them."""

    def to_json(self) -> dict[str, Any]:
        """The node as run.json and ``status --json`` give it."""
        data = {"node_rank": self.node_rank, "host": self.host, "state": str(self.state), "exit_code": self.exit_code}
        for name in ("address", "pid", "detail", "log_bytes", "signal", "stopped", "ranks"):
            if getattr(self, name):
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeStatus:
        """A node as run.json keeps it, back as a NodeStatus."""
        return cls(node_rank=int(data.get("node_rank", 0)), host=str(data.get("host", "?")),
                   state=NodeState.parse(data.get("state")), exit_code=data.get("exit_code"),
                   pid=data.get("pid") or None, detail=data.get("detail"), address=data.get("address"),
                   log_bytes=int(data.get("log_bytes") or 0), signal=data.get("signal"),
                   stopped=bool(data.get("stopped")), ranks=data.get("ranks"))

    def replace(self, **changes: Any) -> NodeStatus:
        """A copy with ``changes`` (field=value)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Replacement:
    """A spare host in the place of an excluded one, for an attempt."""

    host: str
    by: str
    why: str

    def describe(self) -> str:
        return f"{self.by} in the place of {self.host} ({self.why})"

    def to_json(self) -> dict[str, str]:
        return {"host": self.host, "by": self.by, "why": self.why}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Replacement:
        return cls(host=str(data.get("host")), by=str(data.get("by")), why=str(data.get("why") or ""))


@dataclass(frozen=True, kw_only=True)
class Recovery:
    """What a restart cost: from the failure to the next attempt's first step, and the steps trained twice."""

    stood_still_s: float
    steps_redone: Optional[int] = None

    def describe(self) -> str:
        redone = "" if self.steps_redone is None else f", {self.steps_redone} step(s) done again"
        return f"stood still {self.stood_still_s:.1f} s{redone}"

    def to_json(self) -> dict[str, Any]:
        return {"stood_still_s": round(self.stood_still_s, 1), "steps_redone": self.steps_redone}

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> Optional[Recovery]:
        if not data or data.get("stood_still_s") is None:
            return None
        return cls(stood_still_s=float(data["stood_still_s"]), steps_redone=data.get("steps_redone"))


def attempt_changes(replacements: tuple[Replacement, ...], recovery: Optional[Recovery]) -> str:
    """``n4 in the place of n2 (lost: ...); stood still 12.3 s, 5 step(s) done again`` (empty: none)."""
    return "; ".join([r.describe() for r in replacements] + ([recovery.describe()] if recovery else []))


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
    nodes: tuple[NodeStatus, ...] = ()
    """Its nodes (hosts, node ranks) and how each ended: an attempt may run on other hosts than the one before."""
    replacements: tuple[Replacement, ...] = ()
    """Spares it ran on in the place of excluded hosts."""
    recovery: Optional[Recovery] = None
    """How long the run stood still before its first step, and the steps done again."""
    timeline: Optional[Mapping[str, Any]] = None
    """Where its seconds went (``rundir.timeline``)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptInfo:
        """An attempt as run.json keeps it, back as an AttemptInfo."""
        return cls(attempt=int(data.get("attempt", 0)), state=RunState.parse(data.get("state")),
                   exit_code=data.get("exit_code"), from_step=data.get("from_step"), ended_by=data.get("ended_by"),
                   started_at=data.get("started_at") or data.get("submitted_at"),
                   finished_at=data.get("finished_at"), job_id=data.get("job_id"),
                   nodes=tuple(NodeStatus.from_json(n) for n in data.get("nodes") or ()),
                   replacements=tuple(Replacement.from_json(r) for r in data.get("replacements") or ()),
                   recovery=Recovery.from_json(data.get("recovery")),
                   timeline=data.get("timeline") if isinstance(data.get("timeline"), Mapping) else None)

    def to_json(self) -> dict[str, Any]:
        """The attempt as run.json keeps it."""
        data = {"attempt": self.attempt, "state": str(self.state), "exit_code": self.exit_code,
                "from_step": self.from_step, "ended_by": self.ended_by, "started_at": self.started_at,
                "finished_at": self.finished_at, "job_id": self.job_id,
                "nodes": [n.to_json() for n in self.nodes] or None,
                "replacements": [r.to_json() for r in self.replacements] or None,
                "recovery": self.recovery.to_json() if self.recovery else None,
                "timeline": dict(self.timeline) if self.timeline else None}
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
    replacements: tuple[Replacement, ...] = ()
    """Spares this attempt runs on in the place of excluded hosts."""
    recovery: Optional[Recovery] = None
    """How long the run stood still before this attempt's first step, and the steps done again."""
    job: Mapping[str, Any] = field(default_factory=dict)
    """What the backend says of its job (Slurm: ``job_id``, ``slurm_state``, ``restarts``, how often it
    requeued the job), shown in ``--json`` beside the common fields."""
    gpu_samples: tuple[Mapping[str, Any], ...] = ()
    """The newest GPU samples of the run's nodes (``gpu/node<R>.jsonl``; none where no node has nvidia-smi)."""

    @property
    def job_id(self) -> Optional[str]:
        """The scheduler's id of the run's job, for a run a scheduler runs."""
        value = self.job.get("job_id")
        return None if value is None else str(value)

    def to_json(self) -> dict[str, Any]:
        """The documented ``status --json`` form."""
        data: dict[str, Any] = {
            "run_id": self.run_id, "state": str(self.state), "exit_code": self.exit_code,
            "nodes": [n.to_json() for n in self.nodes],
            "first_failure": self.first_failure.to_json() if self.first_failure else None,
            "last_metrics": self.last_metrics, "attempt": self.attempt, "from_step": self.from_step,
            "attempts": [a.to_json() for a in self.attempts],
            "replacements": [r.to_json() for r in self.replacements],
            "recovery": self.recovery.to_json() if self.recovery else None,
            "gpu_samples": list(self.gpu_samples),
        }
        data.update({k: v for k, v in self.job.items() if k not in data and v is not None})
        return data
