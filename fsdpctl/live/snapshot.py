"""A run as it stands at one moment, as every live view shows it (``top``, ``Run.watch``, the exports):
the run's progress, each node and its GPUs now, each rank's newest window, the straggler and why,
the attempts and the hosts in reserve, the newest log lines. Plain frozen data; ``to_json`` is the
documented form (``top --json``, ``fsdpctl.watch``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from ..rundir.lines import LogLine
from ..rundir.status import AttemptInfo, Recovery, Replacement, Resize


@dataclass(frozen=True, kw_only=True)
class GpuNow:
    """One GPU in its node's newest sample."""

    index: Any
    bus_id: Optional[str] = None
    sm_mhz: Optional[float] = None
    sm_max_mhz: Optional[float] = None
    util_pct: Optional[float] = None
    mem_mib: Optional[float] = None
    mem_total_mib: Optional[float] = None
    temp_c: Optional[float] = None
    power_w: Optional[float] = None
    reasons: tuple[str, ...] = ()
    """The clock reasons slowing it now (HW slowdown, SW power cap...)."""
    faults: tuple[str, ...] = ()
    """What is wrong with it now: uncorrectable ECC errors, a pending row remap."""


@dataclass(frozen=True, kw_only=True)
class NodeNow:
    """One node of the run's newest attempt."""

    node_rank: int
    host: str
    state: str
    ranks: Optional[str] = None
    """Its global ranks (``0-7``), as its local rank 0 said."""
    exit_code: Optional[int] = None
    step: Optional[int] = None
    """The newest step its ranks' timings are in."""
    gpus: tuple[GpuNow, ...] = ()
    sampled_at: Optional[float] = None
    """When its GPUs were sampled last (epoch seconds)."""
    faults: tuple[str, ...] = ()
    """Hardware faults its GPU watcher said during this attempt."""
    detail: Optional[str] = None
    """Why it is lost or failed, where known."""


@dataclass(frozen=True, kw_only=True)
class RankNow:
    """One rank in the newest per-rank window, with its compute time in the windows before."""

    rank: int
    node_rank: Optional[int] = None
    host: Optional[str] = None
    local_rank: Optional[int] = None
    step: Optional[int] = None
    compute_s: Optional[float] = None
    comm_s: Optional[float] = None
    data_s: Optional[float] = None
    wall_s: Optional[float] = None
    mem_mb: Optional[float] = None
    recent_compute_s: tuple[Optional[float], ...] = ()
    """Its compute time in the newest windows, oldest first (the heat row)."""


@dataclass(frozen=True, kw_only=True)
class Progress:
    """The run as a whole."""

    run_id: str
    profile: str
    backend: str
    state: str
    attempt: int = 1
    step: Optional[int] = None
    total_steps: Optional[int] = None
    tokens_per_s: Optional[float] = None
    loss: Optional[float] = None
    val_loss: Optional[float] = None
    mfu: Optional[float] = None
    eta_s: Optional[float] = None
    elapsed_s: Optional[float] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    exit_code: Optional[int] = None
    live: bool = False
    """A follower collects the run now: what is shown is current (within a second or two)."""
    data_until: Optional[float] = None
    """When the data stops (epoch seconds): the follower's last word, for a run shown as not live."""
    note: Optional[str] = None
    """Why the data is not live, in a line, when it is not and the run is not over."""
    first_failure: Optional[str] = None
    loss_history: tuple[tuple[int, float], ...] = ()
    tokens_history: tuple[tuple[int, float], ...] = ()
    metrics: bool = False
    """The run writes metrics (a program of the user's may not)."""


@dataclass(frozen=True, kw_only=True)
class HostsNow:
    """The profile's hosts held in reserve or left out."""

    spares: tuple[str, ...] = ()
    excluded: tuple[dict[str, Any], ...] = ()
    """``host``, ``reason``, ``since``, ``run_id`` each."""


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A run at ``taken_at`` (epoch seconds)."""

    taken_at: float
    run: Progress
    nodes: tuple[NodeNow, ...] = ()
    ranks: tuple[RankNow, ...] = ()
    straggler: Optional[dict[str, Any]] = None
    """``text`` (the verdict), ``rank``, ``node``, ``host``, ``ratio`` where known, and ``cause``
    when its GPU's samples show one."""
    attempts: tuple[AttemptInfo, ...] = ()
    """The earlier attempts, oldest first."""
    replacements: tuple[Replacement, ...] = ()
    recovery: Optional[Recovery] = None
    resize: Optional[Resize] = None
    """This attempt runs on another number of nodes than the one before (an elastic run)."""
    hosts: HostsNow = field(default_factory=HostsNow)
    logs: tuple[LogLine, ...] = ()
    """The newest log lines, oldest first."""
    goodput: Optional[str] = None
    """Where the run's time went so far, in a line (``fsdpctl.accounting``; ``Run.watch`` counts it again
    when due: ``fsdpctl.accounting.cache``)."""

    @property
    def over(self) -> bool:
        """The run has ended (its record says so)."""
        from ..rundir.state import RunState

        return RunState.parse(self.run.state).is_over

    def to_json(self) -> dict[str, Any]:
        """The snapshot as ``top --json`` prints it: plain data."""
        def plain(value: Any) -> Any:
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
            if isinstance(value, LogLine):
                return {"node_rank": value.node_rank, "host": value.host, "rank": value.rank, "text": value.text}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            return value

        data = {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if f.name not in ("attempts", "replacements", "recovery", "resize")}
        data["attempts"] = [a.to_json() for a in self.attempts]
        data["replacements"] = [r.to_json() for r in self.replacements]
        data["recovery"] = self.recovery.to_json() if self.recovery else None
        data["resize"] = self.resize.to_json() if self.resize else None
        return data
