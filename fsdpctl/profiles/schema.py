"""What a cluster profile may say: frozen dataclasses whose field docstrings are the reference.

The loader (``loader.py``) reads YAML into these types strictly; ``docs/profiles.md`` is
generated from the docstrings here, so the reference never drifts from the code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from .container_spec import ContainerSpec  # noqa: F401 - a profile's section type
from .elastic_spec import ElasticSpec  # noqa: F401 - a profile's section type
from .environment_spec import EnvironmentSpec  # noqa: F401 - a profile's section type
from .export_spec import ExportSpec, MlflowSpec, WandbSpec  # noqa: F401 - a profile's section types
from .notify_spec import NotifySpec  # noqa: F401 - a profile's section type
from .restart_spec import STOP_SIGNALS, RestartSpec, StopSignal  # noqa: F401 - a profile's section type

Device = Literal["auto", "cuda", "cpu"]
RendezvousBackend = Literal["c10d", "static"]
HostKeyPolicy = Literal["reject", "accept-new"]

# What may reach a shell unquoted-looking is checked here once, so every later layer can trust it.
# (Values are shell-quoted in the templates as well; these patterns keep names sane and readable.)
HOST_PATTERN = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})|\[?[0-9A-Fa-f:.]+\]?)$")
USER_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IFNAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
WORKDIR_PATTERN = re.compile(r"^(?:~|~/|/|\.)?[A-Za-z0-9_./+@%,:=-]*$")
SLURM_WORD_PATTERN = re.compile(r"^[A-Za-z0-9_.,:+=/@%-]+$")
SLURM_TIME_PATTERN = re.compile(
    r"^(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED)$"
)
SLURM_DIRECTIVE_PATTERN = re.compile(r"^--[a-z][a-z0-9-]*(?:=[^\s'\"`$\\;|&<>]+)?$")


# Variables the profile's network section owns; setting them in env would silently disagree.
# NCCL_NET is not among them: ``ib: false`` sets it to Socket, but a profile's env may name a net
# plugin's transport instead (EFA's aws-ofi-nccl is no InfiniBand, yet wants its plugin).
NETWORK_OWNED_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_IB_HCA")
SIZE_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")
SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30,
              "TiB": 2**40}


def size_bytes(text: str) -> int:
    """``80GiB``, ``81559MiB``, ``80GB`` as bytes (ValueError for anything else)."""
    match = SIZE_PATTERN.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2)])
# Variables fsdpctl sets for every run: the run's processes are found and stopped by FSDPCTL_RUN_ID.
FSDPCTL_OWNED_ENV = ("FSDPCTL_RUN_ID", "FSDPCTL_RUN_DIR", "FSDPCTL_NODE_RANK", "FSDPCTL_PYTHON",
                     "FSDPCTL_HEAD_ADDR", "FSDPCTL_SECRET_NAMES", "FSDPCTL_REQUEUE_MARKER")


CREDENTIAL_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def looks_like_credential(name: str) -> bool:
    """A variable name that usually holds a credential (``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``)."""
    return any(word in name.upper() for word in CREDENTIAL_WORDS)


def env_name_problem(name: str) -> tuple[str, str] | None:
    """(problem, fix) when ``name`` cannot be set for the ranks, wherever it is given."""
    if not ENV_NAME_PATTERN.match(name):
        return "is not a valid environment variable name", "use letters, digits and _ and do not start with a digit"
    if name in NETWORK_OWNED_ENV:
        return "is set from the network section", "set network.interface / network.ib / network.ib_hca instead"
    if name in FSDPCTL_OWNED_ENV:
        return "is set by fsdpctl for every run", "use another name"
    return None


def slurm_directive_name(directive: str) -> str:
    """``--mem=0`` -> ``mem`` (a directive as ``slurm.directives`` holds it)."""
    return directive[2:].split("=", 1)[0]


# Directives fsdpctl writes itself (the run's layout and requeue depend on them).
SLURM_OWNED_DIRECTIVES = ("job-name", "nodes", "ntasks-per-node", "output", "error", "open-mode", "requeue",
                          "no-requeue", "signal", "chdir")


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """One node. In YAML either a plain string (the host) or a mapping with ``host`` and options."""

    host: str
    """Address or ``~/.ssh/config`` alias to reach the node over SSH."""
    address: Optional[str] = None
    """IP address the other nodes use to reach this one (rendezvous); default: ``host``."""
    port: Optional[int] = None
    """SSH port for this host; overrides ``ssh.port``."""
    user: Optional[str] = None
    """SSH user for this host; overrides ``ssh.user``."""
    gpus: Optional[Union[int, tuple[int, ...]]] = None
    """This host's GPUs: a count (for ``nproc_per_node: auto``, instead of counting them at run time), or
    the indices its ranks use, as ``nvidia-smi`` numbers them (``[2, 4]``: one rank each, and
    ``CUDA_VISIBLE_DEVICES=2,4``); ``launch --exclude HOST:3`` leaves one out of either."""
    nproc: Optional[int] = None
    """Processes on this host, over ``nproc_per_node``: hosts with different GPU counts (8 and 2), or 2
    ranks on one CPU host and 1 on another. Global ranks are numbered across the nodes in order."""
    interface: Optional[str] = None
    """This host's own name for the card that connects the nodes, where names differ between hosts
    (overrides ``network.interface`` on this host)."""

    @property
    def gpu_count(self) -> Optional[int]:
        """Its GPUs as the profile counts them: the count given, or how many it chose (None: unsaid)."""
        return len(self.gpus) if isinstance(self.gpus, tuple) else self.gpus

    @property
    def chosen_gpus(self) -> tuple[int, ...]:
        """The GPUs its ranks use, by index (empty: every GPU it has)."""
        return self.gpus if isinstance(self.gpus, tuple) else ()


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    """How the nodes reach each other."""

    interface: Optional[str] = None
    """Network interface that connects the nodes: GLOO_SOCKET_IFNAME, and NCCL_SOCKET_IFNAME in NCCL's
    exact-match form (``=eth0``: a plain name is a prefix to NCCL, and would match ``eth0.100`` too)."""
    ib: bool = False
    """Use InfiniBand; false sets NCCL_IB_DISABLE=1 and NCCL_NET=Socket, so neither NCCL nor a net
    plugin installed on the node tries RDMA (``env: {NCCL_NET: ...}`` names a plugin's transport instead)."""
    ib_hca: Optional[str] = None
    """InfiniBand adapters NCCL may use (NCCL_IB_HCA, e.g. ``mlx5_0,mlx5_1``); needs ``ib: true``."""


@dataclass(frozen=True, kw_only=True)
class HealthSpec:
    """What the preflight checks of the nodes' hardware before every launch (``doctor --health``
    checks more: the kernel log's XID errors, DCGM, InfiniBand counters)."""

    preflight: bool = True
    """Ask every GPU (nvidia-smi) before a launch: uncorrectable ECC errors, pending or failed row
    remaps, hardware clock slowdowns, power caps, compute mode, and processes already on a GPU.
    A fault or another process on a GPU stops the launch. Hosts without nvidia-smi are not asked."""
    allow_busy_gpus: bool = False
    """Start even when other processes already use a GPU (``--allow-busy-gpus``): they share it and
    slow the run; the preflight then only warns."""
    sample_seconds: float = 5.0
    """During a run, sample every GPU (clocks and their slowdown reasons, temperature, power,
    utilisation, memory, ECC errors) this often into ``gpu/node<R>.jsonl``, shown by ``status`` and
    ``report``; a new uncorrectable ECC error or hardware XID is said at once in the node's log and
    makes it the node a spare replaces. 0: no sampling. Nodes without nvidia-smi are not sampled."""


@dataclass(frozen=True, kw_only=True)
class TelemetrySpec:
    """What fsdpctl's start-up hook records in every rank of your own program, with no code of yours:
    each rank's steps (its optimizer steps), loss, wait for data, time in collectives, compute, peak
    memory and tokens, about once a second into ``telemetry/node<N>.jsonl``, read by ``top``,
    ``status``, ``report``, the dashboard and the exports. The bundled workload times itself."""

    enabled: bool = True
    """Record them (``launch --no-telemetry`` for one run). Its hooks fail open: an error of theirs turns
    them off for that rank, never the program."""
    tokens_per_step: Optional[int] = None
    """Tokens per optimizer step over all ranks (``--tokens-per-step``), for an exact tokens/s; without it,
    tokens/s is estimated from batches that show their tokens (an integer 2-D tensor, ``input_ids``)."""
    flops_per_token: Optional[float] = None
    """Your model's training FLOPs per token (``--flops-per-token``; e.g. 6 x the parameters multiplied per
    token, plus attention's): with it, MFU against the GPU's dense bf16 peak where fsdpctl knows that GPU.
    Without it, no MFU is shown."""
    nccl_timing: bool = False
    """Time NCCL's collectives on the GPU (``TORCH_NCCL_ENABLE_TIMING=1``): the time in collectives, and so
    the straggler rule, on GPUs. Off by default: CUDA events around every collective have a cost fsdpctl
    has not yet measured on a GPU."""


@dataclass(frozen=True, kw_only=True)
class RendezvousSpec:
    """Where and how the torchrun agents on the nodes find each other."""

    backend: RendezvousBackend = "c10d"
    """c10d (torchrun's store on the master; node ranks assigned at start) or static (fixed ranks)."""
    port: Union[int, Literal["auto"]] = "auto"
    """TCP port on the master node for the rendezvous store; auto: one derived from the run id
    (20000-29999, so concurrent runs differ), checked free and reachable before launch."""
    timeout: int = 600
    """Seconds torchrun waits at the rendezvous for every node before it gives up (c10d's
    ``join_timeout``, static's store timeout); when no rank of a node has started after a minute, or
    after half this timeout if that is sooner, the node's log says what the rendezvous waits for."""
    host: Optional[str] = None
    """Which of ``hosts`` is the master (by its ``host`` value); default: the first. Under static
    rendezvous it is node rank 0 (static's store is served by node rank 0)."""


@dataclass(frozen=True, kw_only=True)
class SSHSpec:
    """How fsdpctl connects to the nodes (``backend: ssh``)."""

    user: Optional[str] = None
    """Login user; default: ``~/.ssh/config`` or the local user."""
    port: Optional[int] = None
    """SSH port; default: ``~/.ssh/config`` or 22."""
    identity_file: Optional[str] = None
    """Private key file; default: ``~/.ssh/config``, the agent and the usual key files."""
    known_hosts: Optional[str] = None
    """known_hosts file to check host keys against; default: ``~/.ssh/known_hosts``."""
    host_key_policy: HostKeyPolicy = "reject"
    """reject: unknown or changed host keys refuse the connection; accept-new: record new keys (as
    OpenSSH's StrictHostKeyChecking=accept-new), still refuse changed ones."""
    proxy_jump: Optional[str] = None
    """Jump host (``user@bastion:port``), as OpenSSH's ProxyJump."""
    connect_timeout: float = 10.0
    """Seconds to wait for a host to answer and authenticate."""


@dataclass(frozen=True, kw_only=True)
class SlurmSpec:
    """Batch settings for ``fsdpctl submit --slurm``."""

    partition: Optional[str] = None
    """Partition (``#SBATCH --partition``); default: the cluster's default partition."""
    account: Optional[str] = None
    """Account to charge (``--account``)."""
    qos: Optional[str] = None
    """Quality of service (``--qos``)."""
    time: Optional[str] = None
    """Time limit in Slurm's format (``MM``, ``HH:MM:SS``, ``D-HH:MM``...); quote it in YAML."""
    nodes: int = 1
    """Number of nodes to allocate."""
    gpus_per_node: Optional[int] = None
    """GPUs per node (``--gpus-per-node``); also the process count when ``nproc_per_node: auto``."""
    cpus_per_task: Optional[int] = None
    """CPUs for each node's torchrun (``--cpus-per-task``)."""
    constraint: Optional[str] = None
    """Node features (``--constraint``)."""
    directives: tuple[str, ...] = ()
    """Extra ``#SBATCH`` options, each written as ``--name=value`` (e.g. ``--mem=0``)."""
    requeue: bool = False
    """Preemption-safe runs: SIGUSR2 comes ``signal_seconds`` before the time limit, the workload
    saves a checkpoint, the job requeues itself and resumes from it; a preempted or requeued job resumes too."""
    signal_seconds: int = 120
    """With ``requeue``: seconds before the time limit that SIGUSR2 arrives (to finish a step and save)."""
    via: Literal["sbatch", "submitit"] = "sbatch"
    """How the job is submitted: fsdpctl's batch script through ``sbatch``, or submitit's Slurm executor."""
    spares: int = 0
    """Spare nodes the job holds beyond ``nodes`` (``--no-kill``): when a node fails, the next step runs
    in the same allocation with a spare in its place, from the newest checkpoint (``via: sbatch``)."""


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A job kept in a file (``jobs/NAME.yaml``): your program, its code, environment and requirements,
    so a job run every day is never typed again. Paths are relative to the file; flags given with
    ``--job`` win over it."""

    name: str
    """The job's name (letters, digits, ``.``, ``_``, ``-``)."""
    command: tuple[str, ...]
    """Your program and its arguments, as every rank gets them: ``[train.py, --lr, "3e-4"]`` or
    ``[-m, mypackage.train]``."""
    profile: Optional[str] = None
    """The profile it runs on when ``--profile`` is not given."""
    code: Optional[str] = "."
    """The folder copied to every node's run directory (the ranks start in it); null: copy nothing,
    the ranks start in ``chdir``."""
    chdir: Optional[str] = None
    """With ``code: null``: the folder the ranks start in, which every node already has (shared storage)."""
    code_limit_mb: int = 100
    """Refuse to copy more code than this many MB."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for every rank, after the profile's."""
    secrets: tuple[str, ...] = ()
    """Names of variables taken from the environment fsdpctl runs in and handed to every rank, never
    written anywhere (see the profile's ``secrets``)."""
    requirements: tuple[str, ...] = ()
    """Requirement lines every node must meet (``numpy>=1.24``), the same versions everywhere."""
    requirements_file: Optional[str] = None
    """A requirements.txt to check the same way."""
    nproc_per_node: Optional[int] = None
    """Processes per node (over the profile's)."""
    nodes: Optional[int] = None
    """Slurm: nodes to allocate (over ``slurm.nodes``)."""
    time: Optional[str] = None
    """Slurm: time limit (over ``slurm.time``)."""
    spares: Optional[int] = None
    """Slurm: spare nodes the job holds (over ``slurm.spares``)."""
    fetch: tuple[str, ...] = ()
    """Files or folders under the run directory (``$FSDPCTL_RUN_DIR``) fetched back from every node
    when a foreground launch ends."""
    container: Optional[str] = None
    """The image the ranks run in on every node (over the profile's ``container.image``)."""
    notify: Optional[NotifySpec] = None
    """Notices of this job's runs, in the place of the profile's ``notify`` (see its fields)."""
    environment: Optional[EnvironmentSpec] = None
    """The Python environment made on every node for this job, in the place of the profile's (see its fields)."""


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """A cluster: its nodes, how to reach them, and how to run the bundled workload on them."""

    name: str
    """Profile name; appears in run ids (letters, digits, ``.``, ``_``, ``-``)."""
    backend: str = "ssh"
    """Where jobs run, a name in the backend registry: local (this machine, no SSH), ssh (hosts over
    SSH), slurm (nodes allocated by Slurm), or one an installed package registers."""
    hosts: tuple[HostSpec, ...] = ()
    """Nodes, in node-rank order (ssh: required; local: this machine; slurm: unused)."""
    spares: tuple[HostSpec, ...] = ()
    """Hosts kept in reserve (the same form as ``hosts``): they run nothing, but the preflight checks
    them too; when a node is lost, or its ranks die by a signal the others did not get, or it fails the
    re-check before a restart (``max_restarts``), the first spare that passes takes its place (ssh)."""
    nproc_per_node: Union[int, Literal["auto"]] = "auto"
    """Processes per node: ``auto`` is the node's GPU count; a number is used as given (on CPU too)."""
    device: Device = "auto"
    """Device the workload trains on: auto (CUDA when present), cuda, or cpu (gloo backend)."""
    gpu_memory: Optional[str] = None
    """Memory of each GPU (``80GiB``, ``81559MiB``): what plans are checked against before a launch;
    ``fsdpctl init`` writes what the nodes report."""
    network: NetworkSpec = field(default_factory=NetworkSpec)
    """Interface and InfiniBand settings."""
    rendezvous: RendezvousSpec = field(default_factory=RendezvousSpec)
    """torchrun rendezvous settings."""
    health: HealthSpec = field(default_factory=HealthSpec)
    """The GPU health checks of the preflight."""
    telemetry: TelemetrySpec = field(default_factory=TelemetrySpec)
    """What the start-up hook records in every rank of your own program (see ``telemetry.*``)."""
    container: Optional[ContainerSpec] = None
    """Run the ranks inside a container image on every node (see its fields)."""
    python: Optional[str] = None
    """Python on the nodes that has torch; default: ``python3`` (local: the Python running fsdpctl);
    with ``container``, the Python inside the image; with ``environment``, the Python it is made from."""
    environment: Optional[EnvironmentSpec] = None
    """A Python environment fsdpctl makes on every node from your lock, and runs the ranks in (see its fields)."""
    setup: tuple[str, ...] = ()
    """Shell lines run on each node before torchrun (e.g. ``source ~/venv/bin/activate``). These
    are the one place where a profile writes shell: they are copied into the script verbatim."""
    workdir: str = "~/fsdpctl"
    """Working directory on the nodes; runs go to ``<workdir>/runs/<run_id>/``. local: relative to
    the current directory."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for every rank. Written into the run's scripts: credentials go in ``secrets``."""
    secrets: tuple[str, ...] = ()
    """Names of credentials (``HF_TOKEN``, ``WANDB_API_KEY``...) every rank gets from the environment
    fsdpctl runs in: their values travel inside the command that starts each node and are written in
    no file, script or command line; what a rank prints of them shows as ``***``."""
    node_timeout: int = 30
    """Seconds a foreground run's launcher and each node may hear nothing from each other: the
    launcher then declares the node lost and stops the others, and the node stops its own ranks (a
    killed launcher or a cut link leaves nothing running). A detached run's nodes are not bound by it;
    the follower it leaves takes a node it has not heard from for this long (20 s at least) as lost."""
    hang_timeout: Optional[int] = None
    """Seconds without progress (no new line from any rank; for the bundled workload, no new
    ``step=`` line once it printed one) after which the run counts as hung: every rank's stack and
    the flight-recorder dumps go to ``runs/<id>/hang/``, the odd rank is named, and the run ends with
    exit 124 (see ``on_hang``). Unset or 0: no watchdog. Must exceed the longest quiet stretch of a
    healthy run (compilation, an evaluation, a checkpoint, the time between logged steps)."""
    on_hang: str = "stop"
    """What a hang does: ``stop`` (end the run, exit 124) or ``keep`` (report it and let it run)."""
    stop_signal: StopSignal = "TERM"
    """What a stop (``fsdpctl stop``; Ctrl-C, SIGTERM or SIGHUP to the launcher) gives every rank at once,
    then ``stop_grace`` to save and exit before the rest is killed. Your program reads it in
    ``FSDPCTL_STOP_SIGNAL``; the bundled workload saves a checkpoint on it and exits."""
    stop_grace: int = 10
    """Seconds the ranks have to exit by themselves after ``stop_signal`` (``stop --grace`` over it)."""
    elastic: Optional[ElasticSpec] = None
    """Go on with fewer nodes when a node is to blame and no spare is left (see its fields); needs
    ``max_restarts`` on ssh (a shrink is a restart). Slurm: the next step in the same allocation."""
    max_restarts: int = 0
    """How often ``launch`` starts a failed run again (a rank or node failed, or it hung): it tears
    the run down, re-checks the nodes, and continues in the same run directory (the bundled workload
    from its newest complete checkpoint; your program sees ``FSDPCTL_ATTEMPT``). 0: never."""
    restart: RestartSpec = field(default_factory=RestartSpec)
    """The causes ``max_restarts`` restarts for, exit codes that always restart, an hourly limit."""
    ssh: SSHSpec = field(default_factory=SSHSpec)
    """SSH connection settings."""
    slurm: Optional[SlurmSpec] = None
    """Slurm settings; required for ``backend: slurm``."""
    train: dict[str, Any] = field(default_factory=dict)
    """Defaults for the bundled workload (any of its settings, e.g. ``preset``, ``steps``,
    ``batch_size``, ``fsdp``); command-line flags override them."""
    export: ExportSpec = field(default_factory=ExportSpec)
    """Where every run's numbers go live: TensorBoard, a Prometheus textfile, W&B, MLflow."""
    notify: Optional[NotifySpec] = None
    """Notices to people when a run starts, fails, restarts, finishes or hangs (see its fields)."""
