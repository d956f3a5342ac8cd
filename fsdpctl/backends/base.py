"""The one interface to a job, whatever runs it, and what its methods return.

Every command acts on a job through a ``Backend``: ``doctor`` and ``preflight`` check the nodes,
``start`` starts (or submits) a run, ``follow`` streams it to its end, ``status``, ``read_logs`` and
``stop`` act on it later, from any terminal. The anchors are TorchX's ``Scheduler``
(schedule / describe / log_iter / cancel) and submitit's ``Executor``/``Job``: the caller never asks
which backend it holds. ``fsdpctl.backends.backend_for`` turns a profile or a run into one.

What an instance holds, beyond the protocol: its connections to the nodes (opened on first use,
released by ``close``; a later call opens them again) and, for the runs it started itself, what
following them as their owner takes: the node agents a preflight staged (until ``start``), and the
agents that watch over a foreground run's nodes (until ``follow`` takes them). Any instance can act
on any run (status, logs, stacks, fetch, stop) and follow it from outside through the nodes' files;
only the instance that started a foreground run can follow it as its owner, which is why the API's
``Run`` handle keeps the instance that started it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol

from ..rundir.state import Outcome

if TYPE_CHECKING:
    from ..bundle import Payload
    from ..hostcheck.checks import DoctorReport, HostReport
    from ..plan.types import LaunchPlan
    from ..profiles.schema import ClusterProfile
    from ..rundir.lines import LogLine
    from ..rundir.rundir import RunDir
    from ..rundir.status import RunStatus
    from .hang_watch import HangWatch

__all__ = ["Backend", "DoctorRequest", "LineSink", "Outcome"]

LineSink = Callable[["LogLine"], None]
"""Where a run's lines go."""


@dataclass(frozen=True, kw_only=True)
class DoctorRequest:
    """What ``doctor`` should check."""

    port: int
    """The rendezvous port to try: free on the master, reachable from the others."""
    deep: bool = False
    """Import torch on every node (device count, NCCL's own version)."""
    timeout: float = 20.0
    """Seconds a node's probe may take once connected."""
    concurrency: int = 32
    port_check: bool = True
    nproc: Optional[int] = None
    """Processes per node the run will start (GPUs needed), when known."""
    requirements: tuple[str, ...] = ()
    """Distributions the job imports (``numpy``, ``transformers==4.40``): installed on every node, same versions."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More the probe is asked on every node (``init``: the route to the master, Pythons with torch)."""


class Backend(Protocol):
    """A way of running jobs: this machine, SSH nodes, or Slurm."""

    name: str
    """What run.json calls it."""
    profile: ClusterProfile
    queued: bool
    """Runs wait in a scheduler's queue (plans are made for it: ``make_plan(for_slurm=...)``)."""

    def doctor(self, request: DoctorRequest, on_host: Callable[[HostReport], None] | None = None) -> DoctorReport:
        """Check every node and diff them."""

    def preflight(self, plan: LaunchPlan, payload: Payload, on_host: Callable[[HostReport], None] | None = None
                  ) -> DoctorReport | None:
        """The fast checks before starting ``plan`` (None: this backend has none). ``payload`` (the
        files every node gets and the run's secrets) may be staged on the way."""

    def previews(self, plan: LaunchPlan, scripts: dict[str, str]) -> dict[str, str]:
        """Files the backend would write itself besides the rendered scripts, for ``--dry-run``."""

    def start(self, run: RunDir, payload: Payload, *, detached: bool) -> str:
        """Start (or submit) the run with ``payload`` on its nodes; says how in a few words
        ("submitted as Slurm job 12")."""

    def follow(self, run: RunDir, sink: LineSink, *, owner: bool, watch: HangWatch | None = None,
               signals: bool = False, leave: threading.Event | None = None) -> Outcome:
        """Stream the run's lines to ``sink`` until it ends. ``owner``: this instance started it (it
        keeps the local logs, and an interruption ends the run); otherwise an interruption only stops
        following. ``watch``: the hang watchdog; when its handler says stop, the run is ended and
        fails with exit 124. ``signals``: take SIGINT/SIGTERM/SIGHUP over while following (else the
        caller's handlers stay and a KeyboardInterrupt is the interruption). ``leave``: once set, a
        follower that is not the owner stops following (the outcome's state is not over)."""

    def status(self, run: RunDir) -> RunStatus:
        """run.json, refreshed from the nodes or the scheduler while the run is live."""

    def checkpoint_steps(self, run: RunDir) -> list[int]:
        """The steps of the bundled workload's complete checkpoints in the run directory on the nodes,
        oldest first (raises HostError when no node answers)."""

    def read_logs(self, run: RunDir, sink: LineSink, attempt: int | None = None) -> list[str]:
        """Every line the run has written so far (``attempt``: an earlier attempt's; None: the newest);
        returns notes for the user (a node that did not answer)."""

    def stacks(self, run: RunDir, *, flight: bool = False, py_spy: bool = True, native: bool = False
               ) -> list[dict[str, Any]]:
        """Every rank's stack, one dict per node as ``fsdpctl.node.stacks`` reports it (``error``: that
        node did not answer). ``py_spy``: use it where a node has it (``native``: C/C++ frames too);
        ``flight``: each rank also dumps its flight recorder into ``flight/`` under the node's run
        directory (``fetch(run, "flight")`` brings them here)."""

    def fetch(self, run: RunDir, path: str) -> dict[str, list[str]]:
        """Bring ``path`` (under the run directory on the nodes) here; per node, the local files."""

    def stop(self, run: RunDir) -> dict[str, str]:
        """End every process of the run; returns what each host reports left (empty: nothing)."""

    def close(self) -> None:
        """Release connections."""
