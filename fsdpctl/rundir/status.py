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
    """What a restart cost: from the failed attempt's last training step to the next attempt's first,
    the steps trained twice, and the training speed before the failure and after it (tokens/s of the
    bundled workload's training rows, where they have it; ``fsdpctl.api.recovery``)."""

    stood_still_s: float
    steps_redone: Optional[int] = None
    tok_s_before: Optional[float] = None
    tok_s_after: Optional[float] = None

    def describe(self) -> str:
        redone = "" if self.steps_redone is None else f", {self.steps_redone} step(s) done again"
        speed = ""
        if self.tok_s_before is not None and self.tok_s_after is not None:
            speed = f", {self.tok_s_before:,.0f} -> {self.tok_s_after:,.0f} tok/s"
        return f"stood still {self.stood_still_s:.1f} s{redone}{speed}"

    def to_json(self) -> dict[str, Any]:
        data = {"stood_still_s": round(self.stood_still_s, 1), "steps_redone": self.steps_redone}
        for name in ("tok_s_before", "tok_s_after"):
            if getattr(self, name) is not None:
                data[name] = round(getattr(self, name), 1)
        return data

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> Optional[Recovery]:
        if not data or data.get("stood_still_s") is None:
            return None
        return cls(stood_still_s=float(data["stood_still_s"]), steps_redone=data.get("steps_redone"),
                   tok_s_before=data.get("tok_s_before"), tok_s_after=data.get("tok_s_after"))


@dataclass(frozen=True, kw_only=True)
class Resize:
    """An attempt that runs on another number of nodes than the one before (``elastic``): fewer when
    a node was to blame and no spare was left, all of them again when excluded hosts came back."""

    nodes: int
    """The nodes this attempt runs on."""
    before: int
    """The nodes the attempt before ran on (a run that starts short: the profile's own count)."""
    full: int
    """The run's full size: the profile's nodes."""
    hosts: tuple[str, ...]
    """The hosts that went (a shrink) or came back (a grow)."""
    why: str
    """Why, in a few words: the blame of each host that went, or how the ones back came back."""
    batch: Optional[str] = None
    """How the bundled workload keeps its global batch on this many nodes (``global batch 24 kept:
    batch 8 x accumulation 3 per rank``)."""

    @property
    def grows(self) -> bool:
        return self.nodes > self.before

    def describe(self) -> str:
        """``runs on 2 of 3 nodes: 10.0.0.3 out (lost: ...)``, or ``grows back to 3 of 3 nodes: ...``."""
        hosts = ", ".join(self.hosts)
        kept = f"; {self.batch}" if self.batch else ""
        if self.grows:
            return f"grows back to {self.nodes} of {self.full} nodes: {hosts} back ({self.why}){kept}"
        return f"runs on {self.nodes} of {self.full} nodes: {hosts} out ({self.why}){kept}"

    def to_json(self) -> dict[str, Any]:
        data = {"nodes": self.nodes, "before": self.before, "full": self.full, "hosts": list(self.hosts),
                "why": self.why}
        if self.batch:
            data["batch"] = self.batch
        return data

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]]) -> Optional[Resize]:
        if not data or data.get("nodes") is None:
            return None
        return cls(nodes=int(data["nodes"]), before=int(data.get("before") or data["nodes"]),
                   full=int(data.get("full") or data["nodes"]), hosts=tuple(data.get("hosts") or ()),
                   why=str(data.get("why") or ""), batch=data.get("batch"))


def attempt_changes(replacements: tuple[Replacement, ...], recovery: Optional[Recovery],
                    resize: Optional[Resize] = None) -> str:
    """``n4 in the place of n2 (lost: ...); stood still 12.3 s, 5 step(s) done again`` (empty: none);
    a resize first (``runs on 2 of 3 nodes: n3 out (lost: ...)``)."""
    return "; ".join(([resize.describe()] if resize else []) + [r.describe() for r in replacements]
                     + ([recovery.describe()] if recovery else []))


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
    resize: Optional[Resize] = None
    """It ran on another number of nodes than the attempt before (``elastic``)."""
    restart: Optional[Mapping[str, Any]] = None
    """Why it was or was not started again (``fsdpctl.api.restart_causes.Verdict``)."""

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
                   timeline=data.get("timeline") if isinstance(data.get("timeline"), Mapping) else None,
                   resize=Resize.from_json(data.get("resize")),
                   restart=data.get("restart") if isinstance(data.get("restart"), Mapping) else None)

    def to_json(self) -> dict[str, Any]:
        """The attempt as run.json keeps it."""
        data = {"attempt": self.attempt, "state": str(self.state), "exit_code": self.exit_code,
                "from_step": self.from_step, "ended_by": self.ended_by, "started_at": self.started_at,
                "finished_at": self.finished_at, "job_id": self.job_id,
                "nodes": [n.to_json() for n in self.nodes] or None,
                "replacements": [r.to_json() for r in self.replacements] or None,
                "recovery": self.recovery.to_json() if self.recovery else None,
                "timeline": dict(self.timeline) if self.timeline else None,
                "resize": self.resize.to_json() if self.resize else None,
                "restart": dict(self.restart) if self.restart else None}
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
    resize: Optional[Resize] = None
    """This attempt runs on another number of nodes than the one before (``elastic``)."""
    restart: Optional[Mapping[str, Any]] = None
    """This attempt failed: why it was or was not started again (``fsdpctl.api.restart_causes.Verdict``)."""
    stop_checkpoint: Optional[int] = None
    """Stopped: the step of the checkpoint the bundled workload saved at its end."""
    notes: tuple[str, ...] = ()
    """What went wrong beside the run, one line each (a notice not sent)."""
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
            "resize": self.resize.to_json() if self.resize else None,
            "restart": dict(self.restart) if self.restart else None,
            "stop_checkpoint": self.stop_checkpoint, "notes": list(self.notes),
            "gpu_samples": list(self.gpu_samples),
        }
        data.update({k: v for k, v in self.job.items() if k not in data and v is not None})
        return data
