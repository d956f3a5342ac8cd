"""The one interface to a job, whatever runs it: what every backend must do, and what it may.

Every command acts on a job through a ``Backend``; ``fsdpctl.backends.backend_for`` turns a profile
or a run into one, and the caller never asks which one it holds. The anchors are torchx's
``Scheduler`` (a few abstract methods, ``submit = schedule(submit_dryrun(...))``) and submitit's
``Executor``/``Job``.

A backend has two faces. Its class is pure: it places a run (``placement``, ``finish_plan``: the
nodes, the master, the backend's own part of the plan), renders its scripts and judges a profile,
touching nothing; ``make_plan`` and the profile loader call it. An instance acts: it starts a run
and hands back the ``Follower`` that follows it to its end (the only holder of what following a
run as its owner takes: the node agents that watch over it), and acts on any run later, from any
terminal (status, logs, fetch, stop). What every backend must get right is written down as a
contract suite (``tests/contract``) that every backend passes, a fake one among them.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Protocol

from ..errors import UsageError

if TYPE_CHECKING:
    from ..bundle import Payload
    from ..hostcheck.checks import DoctorReport, HostReport
    from ..live.tails import LogTail
    from ..plan.types import LaunchPlan, Overrides, Placement, PlanContext
    from ..profiles.schema import ClusterProfile, HostSpec
    from ..rundir.lines import LogLine
    from ..rundir.rundir import RunDir
    from ..rundir.state import Outcome
    from ..rundir.status import RunStatus
    from .hang_watch import HangWatch
    from .transport import Transport

__all__ = ["Backend", "DoctorRequest", "Follower", "LineSink", "Preflight", "ProfileProblem", "TraceNode"]

LineSink = Callable[["LogLine"], None]
"""Where a run's lines go."""
ProfileProblem = tuple[str, str, str]
"""A profile a backend cannot run: (field, what is wrong, the fix), reported at the field's line."""


@dataclass(frozen=True, kw_only=True)
class DoctorRequest:
    """What ``doctor`` should check."""

    port: int
    """The rendezvous port to try: free on the master, reachable from the others."""
    deep: bool = False
    """Import torch on every node (device count, NCCL's own version)."""
    timeout: float = 20.0
    """Seconds a node's probe may take once connected."""
    concurrency: int = 1024
    """Hosts probed at once, at most (every host of a 256-node profile: see ``transport.FAN_OUT``)."""
    port_check: bool = True
    nproc: Optional[int] = None
    """Processes per node the run will start (GPUs needed), when known."""
    requirements: tuple[str, ...] = ()
    """Distributions the job imports (``numpy``, ``transformers==4.40``): installed on every node, same versions."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More the probe is asked on every node (``init``: the route to the master, Pythons with torch)."""
    environment: Any = None
    """The profile's environment (an EnvPlan not yet placed): each node is judged in it where it is
    made, and told that launch will make it where it is not."""


@dataclass
class Preflight:
    """What a preflight found (``report``; None: this backend checks nothing before a start) and what
    it left ready for ``start`` (``staged``: node agents waiting with the payload, for one plan)."""

    report: Optional[DoctorReport] = None
    staged: Any = None

    @property
    def ok(self) -> bool:
        return self.report is None or self.report.ok


@dataclass(frozen=True)
class TraceNode:
    """Where torch-only work (the estimate's trace) can run when this machine has no torch."""

    name: str
    transport: Transport
    python: str


class Follower(Protocol):
    """Follows one run to its end. The one ``start`` returns is the run's owner: it keeps the local
    logs, ends the run when interrupted, and records how it ended; one from ``attach`` only follows
    (an interruption stops the following, not the run)."""

    how: str
    """How the run was started, in a few words ("started on 2 node(s)...", "submitted as Slurm job 12")."""

    def follow(self, sink: LineSink, *, watch: HangWatch | None = None, signals: bool = False,
               leave: threading.Event | None = None) -> Outcome:
        """Stream the run's lines to ``sink`` until it ends. ``watch``: the hang watchdog; when its
        handler says stop, the run is ended and fails with exit 124. ``signals``: take
        SIGINT/SIGTERM/SIGHUP over while following (else the caller's handlers stay and a
        KeyboardInterrupt is the interruption). ``leave``: once set, a follower that is not the owner
        stops following (the outcome's state is not over)."""


class Backend(ABC):
    """A way of running jobs. Subclasses set ``name`` and implement the abstract methods; the
    others have defaults a backend may keep."""

    name: ClassVar[str]
    """Its name in the registry, a profile's ``backend`` and run.json."""
    options: ClassVar[tuple[str, ...]] = ()
    """The settings it takes over its section of the profile (``Overrides.backend_options``): a
    scheduler's ``nodes``, ``time``..."""
    queued: ClassVar[bool] = False
    """Its runs wait in a scheduler's queue: started with ``fsdpctl submit``, restarted (requeued)
    by the scheduler, never by a launcher."""
    takes_spares: ClassVar[bool] = False
    """It runs on the hosts a profile names, and an attempt may run on other hosts than the one
    before: ``spares:``, ``--exclude`` and the replacement of a failed node (``check_hosts`` too)."""

    def __init__(self, profile: ClusterProfile):
        self.profile = profile

    # ---- the class's pure part: a profile, a plan, scripts ----------------------------------------
    @classmethod
    def check_profile(cls, profile: ClusterProfile) -> Optional[ProfileProblem]:
        """What in ``profile`` this backend cannot run (None: nothing)."""
        return None

    @classmethod
    @abstractmethod
    def placement(cls, profile: ClusterProfile, overrides: Overrides, context: PlanContext) -> Placement:
        """Where a run of ``profile`` goes: its nodes (or how many a scheduler allocates), the master,
        the Python and workdir there, what the backend adds to the job. Pure; UsageError when the
        profile cannot run through this backend."""

    @classmethod
    def finish_plan(cls, profile: ClusterProfile, overrides: Overrides, plan: LaunchPlan) -> LaunchPlan:
        """The plan with the backend's own part added (``backend_plan``); pure."""
        return plan

    @classmethod
    def scripts(cls, plan: LaunchPlan) -> dict[str, str]:
        """Every script of the plan by file name (default: ``node<R>.sh`` for each node)."""
        from ..plan.render import render_node_scripts

        return render_node_scripts(plan)

    @classmethod
    def layout(cls, profile: ClusterProfile) -> tuple[Optional[int], Optional[int]]:
        """How many nodes a run of ``profile`` gets and how many GPUs each has (None: not known)."""
        counts = {h.gpu_count for h in profile.hosts if h.gpu_count}
        return max(1, len(profile.hosts)), (min(counts) if counts else None)

    # ---- what every backend must do ---------------------------------------------------------------
    @abstractmethod
    def start(self, run: RunDir, payload: Payload, *, detached: bool, preflight: Optional[Preflight] = None
              ) -> Follower:
        """Start (or submit) the run's current attempt with ``payload`` (the files every node gets
        and the secrets) on its nodes, record it in run.json, and return its owner's follower.
        ``preflight``: what this backend's ``preflight`` staged for this plan. ``detached``: the run
        outlives this process."""

    @abstractmethod
    def attach(self, run: RunDir, *, collect: bool = False) -> Follower:
        """A follower for a run started elsewhere (or earlier): it reads what the nodes write. With
        ``collect`` it is the run's collector (a detached run's follower): it keeps the logs and the
        copies of the nodes' metrics and GPU samples here, unless another process already does."""

    @abstractmethod
    def status(self, run: RunDir) -> RunStatus:
        """run.json, refreshed from the nodes or the scheduler while the run is live."""

    @abstractmethod
    def read_logs(self, run: RunDir, sink: LineSink, attempt: int | None = None) -> list[str]:
        """Every line the run has written so far (``attempt``: an earlier attempt's; None: the newest),
        each with its host, node rank and global rank; returns notes for the user (a node that did
        not answer)."""

    @abstractmethod
    def fetch(self, run: RunDir, path: str) -> dict[str, list[str]]:
        """Bring ``path`` (under the run directory on the nodes) here; per node, the local files."""

    @abstractmethod
    def stop(self, run: RunDir, grace: Optional[int] = None, stop_signal: Optional[str] = None) -> dict[str, str]:
        """End every process of the run and record it as stopped; per host, what is left (empty:
        nothing). The ranks get ``stop_signal`` (a name: ``TERM``, ``USR1``) first and ``grace``
        seconds to exit by themselves (default: the profile's ``stop_signal`` and ``stop_grace``)."""

    @abstractmethod
    def ask(self, run: RunDir, command: str) -> str:
        """The output of a read-only shell ``command`` run in the run's directory on its nodes (the
        first node that answers; HostError when none does)."""

    def stop_checkpoint(self, run: RunDir) -> Optional[int]:
        """The step of the complete checkpoint a stopped run of the bundled workload left at its last
        step (its ranks saved on the stop signal, or had just saved): ``status`` says "stopped after its
        checkpoint of step N". None for a program of the user's (its checkpoints are its own), when the
        newest checkpoint is older than the newest step the rows say (the stop came before a save), or
        when no node answers."""
        if run.plan.command:
            return None
        from ..live.newest import newest_step
        from ..workload.layout import complete_steps_command, parse_steps

        try:
            saved = parse_steps(self.ask(run, complete_steps_command(".")))
        except Exception:  # noqa: BLE001 - a node that does not answer: nothing is said of a checkpoint
            return None
        step = newest_step(run)
        return saved[-1] if saved and step is not None and saved[-1] >= step else None

    # ---- what a backend may do ---------------------------------------------------------------------
    def doctor(self, request: DoctorRequest, on_host: Callable[[HostReport], None] | None = None) -> DoctorReport:
        """Check every node and diff them."""
        raise UsageError(f"backend {self.name}: has no doctor", "check its nodes by hand")

    def preflight(self, plan: LaunchPlan, payload: Payload,
                  on_host: Callable[[HostReport], None] | None = None) -> Preflight:
        """The fast checks before starting ``plan``; ``payload`` may be staged on the way (default: none)."""
        return Preflight()

    def make_environment(self, plan: LaunchPlan, on_bytes: Callable[[int, int], None] | None = None,
                         on_node: Callable[[Any], None] | None = None) -> list[Any]:
        """Make ``plan.environment`` on every node of the plan (or find it made): a NodeEnv each."""
        raise UsageError(f"environment: backend {self.name} does not make environments on its nodes yet",
                         "make it there by hand and set python: to it, or run through the ssh backend")

    def node_environments(self, environment: Any, *, prune: bool, keep: int) -> list[dict[str, Any]]:
        """What each node holds under the environment's root (``fsdpctl env``), pruned first with ``prune``."""
        raise UsageError(f"env: backend {self.name} cannot list or prune the environments on its nodes",
                         "look under the environment's root on the nodes by hand")

    def check_hosts(self, hosts: Sequence[HostSpec], on_host: Callable[[HostReport], None] | None = None,
                    environment: Any = None) -> DoctorReport:
        """doctor's fast checks on ``hosts`` (spares, a host to restore) as a run of the profile would
        use them, nothing staged, no port tried (a backend that ``takes_spares``)."""
        raise UsageError(f"backend {self.name}: has no spare hosts", "check its nodes with fsdpctl doctor")

    @classmethod
    def refresh_records(cls, runs: Sequence[RunDir]) -> None:
        """Bring the run.json of these runs up to date where they are live and their state changes with
        nobody writing it (a scheduler's queue), asking as few questions as it can: ``runs`` lists what
        ``status`` would say. Default: nothing (a launcher or a follower records its runs' states)."""
        return None

    def count_gpus(self) -> Optional[int]:
        """How many GPUs each node has, where the backend can tell before a run without asking a
        scheduler for nodes (None: it cannot; 0: the node has none)."""
        return None

    def previews(self, plan: LaunchPlan, scripts: dict[str, str]) -> dict[str, str]:
        """Files the backend would write itself besides the rendered scripts, for ``--dry-run``."""
        return {}

    def log_tail(self, run: RunDir) -> LogTail:
        """The run's newest log lines as they come, read here only (default: the ``logs/merged.log``
        the follower writes)."""
        from ..live.tails import MergedLogTail

        node_of = {node.host: node.node_rank for node in run.plan.nodes}
        return MergedLogTail(run.paths.logs / "merged.log", node_of)

    def scheduler_status(self, run: RunDir) -> Optional[RunStatus]:
        """How a scheduler says the run stands, asked of the scheduler only, never of the nodes (a live
        view's source while no follower collects the run); None for a backend without one."""
        return None

    def stacks(self, run: RunDir, *, flight: bool = False, py_spy: bool = True, native: bool = False
               ) -> list[dict[str, Any]]:
        """Every rank's stack, one dict per node as ``fsdpctl.node.stacks`` reports it (``error``: that
        node did not answer). ``py_spy``: use it where a node has it (``native``: C/C++ frames too);
        ``flight``: each rank also dumps its flight recorder into ``flight/`` under the node's run
        directory (``fetch(run, "flight")`` brings them here)."""
        raise UsageError(f"backend {self.name}: cannot read the ranks' stacks", "look at the nodes by hand")

    def profile_request(self, run: RunDir, request: str, ranks: str) -> list[dict[str, Any]]:
        """Hand a profile request (``fsdpctl.node.profiling``'s JSON) to the chosen ranks (``ranks``: ``all``
        or a comma list of global ranks): one dict per node as ``fsdpctl.node.profile_request`` answers
        (``error``: that node did not answer)."""
        raise UsageError(f"backend {self.name}: cannot reach the ranks to profile them",
                         "launch with --profile-steps A-B instead")

    def clock_offsets(self, run: RunDir) -> dict[str, dict[str, Any]]:
        """Per host, its clock minus this machine's: ``offset_ns`` and ``error_ns`` (how far it may be
        off), or ``error``; empty where the backend cannot measure it."""
        return {}

    def address_of(self, host: str) -> str:
        """``host``'s address as this machine resolves it (an IP as it is; a name this machine cannot
        resolve as it is, for the nodes to resolve themselves)."""
        import ipaddress
        import socket

        try:
            return str(ipaddress.ip_address(host))
        except ValueError:
            pass
        try:
            return socket.gethostbyname(host)
        except OSError:
            return host

    def trace_node(self) -> Optional[TraceNode]:
        """Where torch-only work can run when this machine has no torch (None: nowhere)."""
        return None

    def close(self) -> None:
        """Release connections (a later call opens them again)."""
        return None
