"""The plan's types: what the command line overrides, each node's command, the Slurm batch, the whole plan.

Frozen dataclasses, JSON-ready through ``to_json``; ``plan_from_json`` reads a run's ``plan.json`` back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol

from .elastic_policy import ElasticPlan, elastic_from_json
from .environment import EnvPlan, env_plan_from_json

if TYPE_CHECKING:
    from ..profiles.schema import ClusterProfile


@dataclass(frozen=True, kw_only=True)
class CodePlan:
    """The user's code folder as it goes to the nodes (the file list itself stays out of the plan)."""

    source: str
    """The folder on this machine."""
    files: int
    bytes: int
    largest: tuple[tuple[str, int], ...]
    """The biggest files, (path, bytes), biggest first."""
    origin: str
    """``git`` (tracked and untracked-not-ignored files) or ``files`` (every file but the ignored ones)."""
    skipped_links: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Overrides:
    """Command-line values; each one beats the profile (CLI flag > profile > default)."""

    train: Mapping[str, Any] = field(default_factory=dict)
    """Workload settings given as flags (``--steps 20`` -> ``{"steps": 20}``)."""
    nproc_per_node: Optional[int] = None
    master_port: Optional[int] = None
    debug: bool = False
    """Add NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=ALL, TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    entry_module: Optional[str] = None
    """Run this module of the workload package instead of the trainer (``doctor --collectives``)."""
    entry_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Variables added for this run only (after the profile's)."""
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    """Settings of the backend that runs it, over its section of the profile (Slurm's ``nodes``,
    ``time``, ``partition``, ``requeue``, ``via``); the backend reads and checks them."""
    command: tuple[str, ...] = ()
    """The user's program instead of the bundled workload: ``SCRIPT.py ARGS...`` or ``-m MODULE ARGS...``."""
    code: Optional[CodePlan] = None
    """The code folder copied to every node's run directory (``code/``); ranks start in it."""
    chdir: Optional[str] = None
    """``--no-code``: where the ranks start instead (a folder every node already has)."""
    requirements: tuple[str, ...] = ()
    """Requirement lines (``numpy>=1.24``) every node must satisfy, besides what the job itself needs."""
    secrets: tuple[str, ...] = ()
    """Names of variables every rank gets from the launcher's environment (``--env NAME``, ``secrets:``)."""
    node_timeout: Optional[int] = None
    """``--node-timeout`` (over ``node_timeout``)."""
    hang_timeout: Optional[int] = None
    """``--hang-timeout`` (over ``hang_timeout``; 0 turns the watchdog off)."""
    allow_busy_gpus: Optional[bool] = None
    """``--allow-busy-gpus`` (over ``health.allow_busy_gpus``)."""
    on_hang: Optional[str] = None
    """``--on-hang`` (over ``on_hang``)."""
    max_restarts: Optional[int] = None
    """``--max-restarts`` (over ``max_restarts``)."""
    attempt: int = 1
    """Which attempt of the run this plan starts: 2 and on continue it in the same run directory (the
    bundled workload from its newest complete checkpoint)."""
    container_image: Optional[str] = None
    """``--container IMAGE`` (over ``container.image``; with no ``container`` section, the runtime's default)."""
    tensorboard: Optional[str] = None
    """``--tensorboard DIR`` (over ``export.tensorboard``)."""
    prometheus: Optional[str] = None
    """``--prometheus PATH`` (over ``export.prometheus``)."""
    telemetry: Optional[bool] = None
    """``--telemetry/--no-telemetry`` (over ``telemetry.enabled``)."""
    tokens_per_step: Optional[int] = None
    """``--tokens-per-step`` (over ``telemetry.tokens_per_step``)."""
    flops_per_token: Optional[float] = None
    """``--flops-per-token`` (over ``telemetry.flops_per_token``)."""
    min_nodes: Optional[int] = None
    """``--min-nodes`` (over ``elastic.min_nodes``; 0: not elastic)."""
    full_nodes: Optional[int] = None
    """An elastic run's full size, when this attempt runs on fewer nodes (set by fsdpctl, not a flag)."""
    elastic_changes: int = 0
    """How often an elastic run's node count changed before this attempt (``FSDPCTL_ELASTIC_ATTEMPT``)."""
    batch_limit: Optional[int] = None
    """The largest per-rank batch the bundled workload may take on fewer nodes (``estimate``'s choice)."""
    environment: Optional[EnvPlan] = None
    """The environment made on every node (``environment:``, ``--env-from``), its files read."""


_LEGACY_OPTION_PREFIX = "slurm_"


def overrides_to_json(overrides: Overrides) -> dict[str, Any]:
    """The overrides as JSON (kept with a run: a later attempt is planned from the same inputs)."""
    return dataclasses.asdict(overrides)


def overrides_from_json(data: dict[str, Any]) -> Overrides:
    """``overrides_to_json`` back as Overrides (tuples where the dataclass has them)."""
    data = dict(data)
    # Written before backend_options: each backend option had a field of its own, named after it.
    legacy = {key: data.pop(key) for key in list(data) if key.startswith(_LEGACY_OPTION_PREFIX)}
    data["backend_options"] = {**{k[len(_LEGACY_OPTION_PREFIX):]: v for k, v in legacy.items() if v is not None},
                               **(data.get("backend_options") or {})}
    for name in ("entry_args", "command", "requirements", "secrets"):
        data[name] = tuple(data.get(name) or ())
    if data.get("code"):
        data["code"] = _code_plan(data["code"])
    data["environment"] = env_plan_from_json(data.get("environment"))
    return Overrides(**data)


def _code_plan(data: dict[str, Any]) -> CodePlan:
    return CodePlan(**{**data, "largest": tuple(map(tuple, data["largest"])),
                       "skipped_links": tuple(data.get("skipped_links", ()))})


@dataclass(frozen=True, kw_only=True)
class ContainerPlan:
    """The image every node's ranks run in (the profile's ``container`` with ``--container``)."""

    runtime: str
    image: str
    mounts: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    pull: str = "missing"
    workdir: Optional[str] = None
    """Where the ranks start inside; None: where they would start without a container."""
    host_python: str = "python3"
    """The hosts' own Python: the node agent, the probe's host part and the GPU sampler."""
    memlock: bool = True
    gpus: bool = False
    """Give the container the host's GPUs (where the host has them): the device is not ``cpu``."""
    ib: bool = False
    """Give it the InfiniBand devices (where the host has them): ``network.ib``."""


def container_from_json(data: Optional[Mapping[str, Any]]) -> Optional[ContainerPlan]:
    """A ContainerPlan from its JSON (None stays None)."""
    if not data:
        return None
    return ContainerPlan(**{**data, "mounts": tuple(data.get("mounts", ())),
                            "options": tuple(data.get("options", ()))})


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """One node of the run and the exact torchrun command it runs."""

    node_rank: int
    host: str
    """How fsdpctl reaches the node (SSH target; ``localhost`` for local)."""
    address: str
    """How the other nodes reach it."""
    nproc: str
    """Processes on this node: a number, or ``gpu`` (torchrun counts the GPUs)."""
    script_path: str
    """The rendered node script, inside the run directory on the node."""
    torchrun_args: tuple[str, ...]
    """Arguments after ``python``: ``-m torch.distributed.run ... -m fsdpctl.workload.train ...``."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables of this node only, after the plan's (its own interface name)."""
    interface: Optional[str] = None
    """Its own card's name, when it differs from the profile's."""
    gpus: tuple[int, ...] = ()
    """The GPUs its ranks use (``CUDA_VISIBLE_DEVICES``), by nvidia-smi's index; empty: every GPU."""


@dataclass(frozen=True, kw_only=True)
class NodeTarget:
    """A node a backend places the run on, before the plan gives it its rank and its command."""

    host: str
    """How fsdpctl reaches it (an SSH target; ``localhost``)."""
    address: str
    """How the other nodes reach it."""
    bind: Optional[str] = None
    """The address torchrun binds to there (``--local-addr``), when the profile gave one."""
    gpus: Optional[int] = None
    """Its GPU count, when the profile says."""
    interface: Optional[str] = None
    """Its own card's name, when it differs from the profile's."""
    nproc: Optional[int] = None
    """Its own process count (``hosts[].nproc``), over the profile's ``nproc_per_node``."""
    chosen_gpus: tuple[int, ...] = ()
    """The GPUs its ranks use, by index (``hosts[].gpus`` as a list); empty: every GPU."""

    @property
    def own_nproc(self) -> Optional[int]:
        """Its processes as its host says them (``nproc``, else one per chosen GPU); None: the run's."""
        return self.nproc or len(self.chosen_gpus) or None


@dataclass(frozen=True, kw_only=True)
class PlanContext:
    """What make_plan takes from the process that plans (kept with the run in inputs.json: a later
    attempt is planned exactly as the first one was)."""

    run_id: str
    local_python: str = "python3"
    """The interpreter running fsdpctl (the ``local`` backend's node runs it)."""
    home: str = "~"
    """This user's home, for paths a scheduler reads itself (it does not expand ``~``)."""
    local_cwd: str = "."
    """Where fsdpctl runs (anchors a relative workdir on this machine)."""

    @classmethod
    def here(cls, run_id: str) -> PlanContext:
        """This process's: its interpreter, this user's home, the current folder (read by the caller
        of ``make_plan``, which itself reads nothing)."""
        import os
        import sys

        return cls(run_id=run_id, local_python=sys.executable, home=os.path.expanduser("~"), local_cwd=os.getcwd())

    def inputs(self) -> dict[str, str]:
        """As make_plan's keyword arguments (and inputs.json keeps them)."""
        return {"local_python": self.local_python, "home": self.home, "local_cwd": self.local_cwd}


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where a backend puts a run: its nodes and master, the Python and workdir there, and what the
    backend adds to the job (workload settings, variables). Computed without touching anything."""

    backend: str
    num_nodes: int
    master_host: str
    master_addr: str
    """How the nodes reach the rendezvous (a ``NodeExpr`` when it is only known on the nodes)."""
    python: str
    workdir: str
    nodes: tuple[NodeTarget, ...] = ()
    """In node-rank order; empty when a scheduler allocates the nodes as the run starts."""
    gpus_per_node: Optional[int] = None
    """GPUs on each node, when the nodes are not known yet but their GPU count is."""
    rdzv_backend: Optional[str] = None
    """None: the profile's; ``standalone`` for a run on one machine (torchrun picks a free port)."""
    train_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Workload settings the backend proposes (the profile and the flags may change them)."""
    train: Mapping[str, Any] = field(default_factory=dict)
    """Workload settings the backend needs (over everyone's)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the backend adds for every rank."""
    max_restarts: Optional[int] = None
    """0: a launcher never restarts this backend's runs (its scheduler does); None: as asked."""
    warnings: tuple[str, ...] = ()


class Placer(Protocol):
    """What ``make_plan`` asks of the backend a run goes through: a ``Backend`` class (pure methods,
    no instance, no connection)."""

    name: str

    def placement(self, profile: ClusterProfile, overrides: Overrides, context: PlanContext) -> Placement:
        """Where the run goes (raises UsageError when the profile cannot run through this backend)."""

    def finish_plan(self, profile: ClusterProfile, overrides: Overrides, plan: LaunchPlan) -> LaunchPlan:
        """The plan with the backend's own part (``backend_plan``) added."""


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """Everything needed to start the run, computed before anything touches a host."""

    run_id: str
    profile_name: str
    profile_source: str
    backend: str
    fsdpctl_version: str
    num_nodes: int
    nproc_per_node: str
    world_size: Optional[int]
    """Known when every node's process count is; ``None`` when torchrun counts GPUs at start."""
    rdzv_backend: str
    master_host: str
    master_addr: str
    master_port: int
    master_addr_is_ip: bool
    env: dict[str, str]
    python: str
    setup: tuple[str, ...]
    workdir: str
    run_dir: str
    """The run's directory on the nodes (``<workdir>/runs/<run_id>``)."""
    local_run_dir: str
    """The run's directory here: plan, scripts, run.json and collected logs."""
    train: dict[str, Any]
    """Resolved workload settings (profile ``train`` overlaid with flags)."""
    nodes: tuple[NodeSpec, ...]
    """Every node with its command; empty when a scheduler allocates the nodes as the run starts."""
    debug: bool
    warnings: tuple[str, ...]
    # Defaults below: plan.json files written before these fields existed still load.
    requirements: tuple[str, ...] = ()
    """Requirement lines every node must satisfy (installed, matching, the same version everywhere)."""
    command: tuple[str, ...] = ()
    """The user's program and its arguments, exactly as every rank receives them; empty: the bundled workload."""
    code: Optional[CodePlan] = None
    chdir: str = "."
    """Where the ranks start, relative to the run directory on the node (``code``) or absolute."""
    secrets: tuple[str, ...] = ()
    """Names of the variables every rank gets from the launcher's environment; their values are in no file."""
    node_timeout: int = 30
    """Seconds a foreground run's launcher and nodes may hear nothing from each other."""
    hang_timeout: Optional[int] = None
    """Seconds without progress after which the run counts as hung (None: no watchdog)."""
    on_hang: str = "stop"
    """What a hang does: ``stop`` (stacks gathered, the run ended, exit 124) or ``keep`` (reported only)."""
    attempt: int = 1
    """Which attempt of the run this is (``launch --resume``, ``--max-restarts``); every rank has it as
    ``FSDPCTL_ATTEMPT``."""
    max_restarts: int = 0
    """How often a foreground launch starts the run again after a failure."""
    stop_signal: str = "TERM"
    """What a stop delivers to every rank first (the profile's ``stop_signal``), by name."""
    stop_grace: int = 10
    """Seconds a stop waits for the ranks to exit by themselves before it kills what is left."""
    gpu_health: bool = True
    """The preflight asks every GPU for faults and other processes (the profile's ``health.preflight``)."""
    allow_busy_gpus: bool = False
    """Other processes on a GPU only warn in the preflight."""
    gpu_sample_seconds: float = 0.0
    """How often every node's GPUs are sampled during the run (``fsdpctl.node.gpu_watch``); 0: never."""
    container: Optional[ContainerPlan] = None
    """The image the ranks run in on every node; None: the nodes' own Python."""
    entry: tuple[str, ...] = ()
    """What torchrun runs on every rank: ``-m fsdpctl.workload.train ARGS``, or the user's program."""
    backend_plan: Mapping[str, Any] = field(default_factory=dict)
    """The backend's own part of the plan, as JSON (Slurm: its batch directives and step command)."""
    shared_run_dir: bool = False
    """The nodes' run directory is on storage this machine reads too (a scheduler's runs): what they
    write is read there, nothing is copied."""
    rdzv_timeout: int = 600
    """Seconds torchrun waits at the rendezvous for every node before it gives up (the profile's
    ``rendezvous.timeout``)."""
    export: Mapping[str, Any] = field(default_factory=dict)
    """Where the run's numbers go (``fsdpctl.plan.export``): ``tensorboard`` (this run's folder),
    ``prometheus`` (the textfile), ``wandb`` and ``mlflow`` (their settings)."""
    elastic: Optional[ElasticPlan] = None
    """An elastic run's part (``fsdpctl.plan.elastic``, which decides for it); None: not elastic."""
    environment: Optional[EnvPlan] = None
    """The environment every node makes before its ranks start, in which they run (``python`` is its)."""

    @property
    def host_python(self) -> str:
        """The Python on the hosts that runs fsdpctl's own helpers there (the node agent, the probe, the
        GPU sampler, the stack reader): the ranks' own, or with a container the hosts' ``host_python``."""
        return self.container.host_python if self.container else self.python

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the plan (``--json``, ``plan.json``)."""
        return dataclasses.asdict(self)



def plan_from_json(data: dict[str, Any]) -> LaunchPlan:
    """A ``plan.json`` (``LaunchPlan.to_json``) back as a LaunchPlan."""
    data = dict(data)
    nodes = tuple(NodeSpec(**{**n, "torchrun_args": tuple(n["torchrun_args"])}) for n in data.pop("nodes", []))
    # Written before backend_plan: the one backend with a part of its own kept it under its name.
    legacy = data.pop(_LEGACY_PLAN_KEY, None)
    if legacy and not data.get("backend_plan"):
        data["backend_plan"] = legacy
    return LaunchPlan(**{**data, "nodes": nodes, "setup": tuple(data.get("setup", ())),
                         "warnings": tuple(data.get("warnings", ())),
                         "requirements": tuple(data.get("requirements", ())),
                         "command": tuple(data.get("command", ())),
                         "secrets": tuple(data.get("secrets", ())),
                         "entry": tuple(data.get("entry", ())),
                         "code": _code_plan(data["code"]) if data.get("code") else None,
                         "container": container_from_json(data.get("container")),
                         "environment": env_plan_from_json(data.get("environment")),
                         "elastic": elastic_from_json(data.get("elastic"))})


_LEGACY_PLAN_KEY = "slurm"
