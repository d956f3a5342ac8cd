"""From a profile and the command line to a launch plan: every value the scripts need.

``make_plan`` is pure: no network, no clock, no subprocess, no file access. The run id, the
local run directory and the local interpreter are passed in, so the same inputs always give the
same plan (and the same rendered scripts).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from . import __version__
from .errors import UsageError
from .profile_schema import SLURM_OWNED_DIRECTIVES, ClusterProfile, slurm_directive_name
from .shell import NodeExpr, shell_join
from .workload import config as train_config

WORKLOAD_MODULE = "fsdpctl.workload.train"
SHIPPED_PACKAGE_DIR = "pkg"
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
# Settings of the workload that fsdpctl owns: each node writes into its own run directory.
_PLAN_OWNED_SETTINGS = ("run_dir",)


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
    slurm_nodes: Optional[int] = None
    slurm_time: Optional[str] = None
    slurm_partition: Optional[str] = None
    slurm_requeue: Optional[bool] = None
    """``--requeue`` / ``--no-requeue`` (over ``slurm.requeue``)."""
    slurm_via: Optional[str] = None
    """``--via sbatch|submitit`` (over ``slurm.via``)."""


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


@dataclass(frozen=True, kw_only=True)
class SlurmPlan:
    """What ``sbatch.sh`` says: its directives and the per-node step command."""

    directives: tuple[tuple[str, str], ...]
    """``#SBATCH --name=value`` pairs, in order (extra profile directives as name/"" pairs)."""
    step_command: str
    """Shell text run by ``srun`` on every node; ``$SLURM_NODEID`` and the head address expand there."""
    nodes: int
    # Defaults: plan.json files written before these fields existed still load (logs, status, stop).
    requeue: bool = False
    """Checkpoint on SIGUSR2 (``signal_seconds`` before the time limit) and requeue the job."""
    signal_seconds: int = 120
    via: str = "sbatch"
    """``sbatch`` (fsdpctl's batch script) or ``submitit`` (submitit's executor runs the step command)."""


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
    slurm: Optional[SlurmPlan]
    debug: bool
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the plan (``--json``, ``plan.json``)."""
        return dataclasses.asdict(self)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def join_path(base: str, *parts: str) -> str:
    """Join node-side paths without touching the local filesystem (``~`` stays for the node)."""
    text = base.rstrip("/") or "/"
    for part in parts:
        part = part.strip("/") if part not in ("", ".") else ""
        if part.startswith("./"):
            part = part[2:]
        if part:
            text = part if text == "." else f"{text.rstrip('/')}/{part}"
    return text


def _resolve_train(profile: ClusterProfile, overrides: Overrides, *, for_slurm: bool,
                   requeue: bool) -> dict[str, Any]:
    for name in _PLAN_OWNED_SETTINGS:
        if name in profile.train or name in overrides.train:
            raise UsageError(f"train.{name}: set by fsdpctl for every run",
                             "remove it; each run writes into <workdir>/runs/<run_id>/")
    settings: dict[str, Any] = {"device": profile.device, "cache_dir": "../../cache"}
    settings.update(profile.train)
    settings.update(overrides.train)
    if for_slurm:
        # Slurm runs the same script again when it requeues a job (preemption, node failure,
        # --requeue): the run then continues from its newest checkpoint instead of refusing.
        settings.setdefault("resume_if_present", True)
    if requeue:
        if settings.get("no_checkpoint"):
            raise UsageError("requeue: a requeued job resumes from a checkpoint, and train.no_checkpoint is set",
                             "drop no_checkpoint, or submit without --requeue")
        settings["checkpoint_on_signal"] = True
    try:
        train_config.make_config(settings)
    except train_config.ConfigError as exc:
        raise UsageError(f"{exc.name}: {exc.problem}", exc.fix) from None
    settings["run_dir"] = "."
    return settings


def auto_port(run_id: str) -> int:
    """The rendezvous port of ``rendezvous.port: auto``: from the run id's random token, so two
    runs started together differ; 20000-29999 stays below Linux's ephemeral range."""
    token = run_id.rsplit("-", 1)[-1]
    return 20000 + int(token, 16) % 10000 if all(c in "0123456789abcdef" for c in token) else 29500


def _env(profile: ClusterProfile, debug: bool, run_id: str) -> dict[str, str]:
    env: dict[str, str] = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        # The workload is shipped into the run directory (the script runs there), so a node needs
        # nothing of fsdpctl installed, and always runs the launcher's own version of it.
        "PYTHONPATH": SHIPPED_PACKAGE_DIR,
        # Every line a worker prints starts with its global rank: logs can be filtered by rank.
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
    }
    net = profile.network
    if net.interface:
        env["NCCL_SOCKET_IFNAME"] = net.interface
        env["GLOO_SOCKET_IFNAME"] = net.interface
    if net.ib:
        if net.ib_hca:
            env["NCCL_IB_HCA"] = net.ib_hca
    else:
        env["NCCL_IB_DISABLE"] = "1"
    if debug:
        env.update(DEBUG_ENV)
    if "PYTHONPATH" in profile.env:
        env["PYTHONPATH"] = f"{SHIPPED_PACKAGE_DIR}:{profile.env['PYTHONPATH']}"
    env.update({k: v for k, v in profile.env.items() if k != "PYTHONPATH"})  # may override the defaults
    env["FSDPCTL_RUN_ID"] = run_id
    return env


def _node_nproc(profile: ClusterProfile, overrides: Overrides, gpus: Optional[int]) -> str:
    if overrides.nproc_per_node is not None:
        return str(overrides.nproc_per_node)
    if isinstance(profile.nproc_per_node, int):
        return str(profile.nproc_per_node)
    if gpus is not None:
        return str(gpus)
    return "gpu"


def _torchrun_args(*, num_nodes: int, run_id: str, rdzv_backend: str, master_addr: str, master_port: int,
                   node_rank: str, local_addr: Optional[str], nproc: str,
                   entry: tuple[str, tuple[str, ...]]) -> tuple[str, ...]:
    args = ["-m", "torch.distributed.run", "--nnodes", str(num_nodes),
            "--nproc-per-node", nproc, "--rdzv-id", run_id]
    if rdzv_backend == "standalone":
        # One node: torchrun picks a free port itself, so concurrent local runs never collide.
        args += ["--standalone"]
    elif rdzv_backend == "static":
        args += ["--rdzv-backend", "static", "--master-addr", master_addr,
                 "--master-port", str(master_port), "--node-rank", node_rank]
    else:
        endpoint = (NodeExpr(f"{master_addr}:{master_port}") if isinstance(master_addr, NodeExpr)
                    else f"{master_addr}:{master_port}")
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    if local_addr:
        args += ["--local-addr", local_addr]
    log_dir = NodeExpr(f"logs/node{node_rank}") if isinstance(node_rank, NodeExpr) else f"logs/node{node_rank}"
    module, module_args = entry
    args += ["--max-restarts", "0", "--log-dir", log_dir, "--tee", "3", "-m", module, *module_args]
    return tuple(args)


def make_plan(
    profile: ClusterProfile,
    *,
    run_id: str,
    local_run_dir: str,
    profile_source: str = "",
    overrides: Overrides | None = None,
    local_python: str = "python3",
    home: str = "~",
    local_cwd: str = ".",
    for_slurm: bool = False,
) -> LaunchPlan:
    """Compute the launch plan. ``local_python`` is the interpreter for ``backend: local``;
    ``home`` expands ``~`` where Slurm reads a path itself (it does not expand ``~``);
    ``local_cwd`` anchors a ``local`` profile's relative workdir (the directory fsdpctl runs in)."""
    overrides = overrides or Overrides()
    if for_slurm and profile.slurm is None:
        raise UsageError(f"profile {profile.name}: has no slurm section",
                         "add slurm: {nodes: N, ...} to the profile, or use `fsdpctl launch`")
    if not for_slurm and profile.backend == "slurm":
        raise UsageError(f"profile {profile.name}: is a Slurm profile",
                         f"use `fsdpctl submit --slurm --profile {profile.name}`")
    requeue = False
    if for_slurm:
        assert profile.slurm is not None
        requeue = profile.slurm.requeue if overrides.slurm_requeue is None else overrides.slurm_requeue
    train = _resolve_train(profile, overrides, for_slurm=for_slurm, requeue=requeue)
    env = _env(profile, overrides.debug, run_id)
    env.update(overrides.extra_env)
    python = profile.python or (local_python if profile.backend == "local" else "python3")
    workdir = profile.workdir
    if profile.backend == "local" and not workdir.startswith(("/", "~")):
        workdir = join_path(local_cwd, workdir)
    if for_slurm and workdir.startswith("~"):
        workdir = join_path(home, workdir[2:]) if workdir != "~" else home
    run_dir = join_path(workdir, "runs", run_id)
    port = overrides.master_port or profile.rendezvous.port
    if port == "auto":
        port = auto_port(run_id)
    warnings: list[str] = []

    if for_slurm:
        assert profile.slurm is not None
        num_nodes = overrides.slurm_nodes or profile.slurm.nodes
        gpus = profile.slurm.gpus_per_node
        nproc = _node_nproc(profile, overrides, gpus)
        hosts: list[tuple[str, str, Optional[str]]] = []
        master_host = master_addr = "$FSDPCTL_HEAD_ADDR"  # found by the batch script at run time
    else:
        specs = profile.hosts or ()
        if profile.backend == "local":
            hosts = [("localhost", "127.0.0.1", None)]
        else:
            # An IP given as the host is also where the others reach it: torchrun binds to it.
            hosts = [(h.host, h.address or h.host, h.address or (h.host if _is_ip(h.host) else None))
                     for h in specs]
        num_nodes = len(hosts)
        master_host = profile.rendezvous.host or hosts[0][0]
        master_addr = next(addr for host, addr, _ in hosts if host == master_host)
        if not _is_ip(master_addr):
            warnings.append(f"rendezvous address {master_addr!r} is a host name: every node must resolve it "
                            f"the same way; give hosts[].address an IP to be sure")
        nproc = _node_nproc(profile, overrides, None)

    rdzv_backend = "standalone" if profile.backend == "local" else profile.rendezvous.backend
    rdzv = {"num_nodes": num_nodes, "run_id": run_id, "rdzv_backend": rdzv_backend, "master_port": port,
            "entry": (overrides.entry_module, overrides.entry_args) if overrides.entry_module
            else (WORKLOAD_MODULE, tuple(train_config.to_argv(train)))}
    nodes = []
    for rank, (host, address, explicit_addr) in enumerate(hosts):
        gpus = profile.hosts[rank].gpus if profile.backend == "ssh" else None
        node_nproc = _node_nproc(profile, overrides, gpus)
        nodes.append(NodeSpec(
            node_rank=rank, host=host, address=address, nproc=node_nproc,
            script_path=join_path(run_dir, f"node{rank}.sh"),
            torchrun_args=_torchrun_args(**rdzv, master_addr=master_addr, node_rank=str(rank),
                                         local_addr=explicit_addr, nproc=node_nproc),
        ))
    counts = [n.nproc for n in nodes] if nodes else [nproc] * num_nodes
    world_size = sum(int(c) for c in counts) if all(c.isdigit() for c in counts) else None

    slurm_plan = None
    if for_slurm:
        step_args = _torchrun_args(**rdzv, master_addr=NodeExpr('"$FSDPCTL_HEAD_ADDR"'),
                                   node_rank=NodeExpr('"$SLURM_NODEID"'), local_addr=None, nproc=nproc)
        slurm_plan = _slurm_plan(profile, overrides, run_id, run_dir, num_nodes, step_args, requeue,
                                 profile_source)
    return LaunchPlan(
        run_id=run_id, profile_name=profile.name, profile_source=profile_source,
        backend="slurm" if for_slurm else profile.backend, fsdpctl_version=__version__,
        num_nodes=num_nodes, nproc_per_node=nproc, world_size=world_size,
        rdzv_backend=rdzv_backend, master_host=master_host, master_addr=master_addr,
        master_port=port, master_addr_is_ip=_is_ip(master_addr), env=env, python=python,
        setup=profile.setup, workdir=workdir, run_dir=run_dir, local_run_dir=local_run_dir,
        train=train, nodes=tuple(nodes), slurm=slurm_plan, debug=overrides.debug,
        warnings=tuple(warnings),
    )


def time_limit_minutes(text: str) -> int | None:
    """A Slurm time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``) in whole minutes,
    rounded up; None for UNLIMITED."""
    if text.upper() == "UNLIMITED":
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    else:  # MM, MM:SS, HH:MM:SS
        hours, minutes, seconds = {1: [0, *parts, 0], 2: [0, *parts], 3: parts}[len(parts)]
    total_seconds = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total_seconds // 60)


def _check_slurm_submission(profile: ClusterProfile, source: str, time_limit: Optional[str], requeue: bool,
                            via: str) -> None:
    """What can only go wrong when submitting: options fsdpctl writes, and time limits that
    requeue or submitit cannot work with."""
    slurm = profile.slurm
    assert slurm is not None
    where = f"{source or profile.name}: "
    for i, directive in enumerate(slurm.directives):
        name = slurm_directive_name(directive)
        if name in SLURM_OWNED_DIRECTIVES:
            fix = {"requeue": "use slurm.requeue: true (or --requeue)", "signal": "use slurm.requeue: true and "
                   "slurm.signal_seconds", "nodes": "use slurm.nodes (or --nodes)",
                   "no-requeue": "leave slurm.requeue false"}.get(name, "remove it")
            raise UsageError(f"{where}slurm.directives[{i}]: --{name} is written by fsdpctl", fix)
    minutes = time_limit_minutes(time_limit) if time_limit else None
    if via == "submitit" and time_limit is None:
        raise UsageError(f"{where}slurm.time: --via submitit needs a time limit (submitit would ask for 5 minutes)",
                         "set slurm.time or pass --time, e.g. --time 02:00:00")
    if requeue and minutes is not None and minutes * 60 < 2 * slurm.signal_seconds:
        raise UsageError(f"{where}slurm.signal_seconds: SIGUSR2 {slurm.signal_seconds} s before a {time_limit} "
                         f"time limit leaves too little time to train between requeues",
                         "raise the time limit to at least twice signal_seconds, or lower signal_seconds")


def _slurm_plan(profile: ClusterProfile, overrides: Overrides, run_id: str, run_dir: str,
                num_nodes: int, step_args: tuple[str, ...], requeue: bool, source: str) -> SlurmPlan:
    slurm = profile.slurm
    assert slurm is not None
    directives: list[tuple[str, str]] = [
        ("job-name", f"fsdpctl-{run_id}"), ("nodes", str(num_nodes)), ("ntasks-per-node", "1"),
    ]
    optional = {
        "gpus-per-node": slurm.gpus_per_node, "cpus-per-task": slurm.cpus_per_task,
        "partition": overrides.slurm_partition or slurm.partition, "account": slurm.account,
        "qos": slurm.qos, "time": overrides.slurm_time or slurm.time, "constraint": slurm.constraint,
    }
    directives += [(name, str(value)) for name, value in optional.items() if value is not None]
    directives.append(("output", join_path(run_dir, "slurm-%j.out")))
    # A requeued job writes on after its first attempt's lines instead of over them.
    directives.append(("open-mode", "append"))
    if requeue:
        directives += [("requeue", ""), ("signal", f"USR2@{slurm.signal_seconds}")]
    directives += [tuple(d[2:].split("=", 1)) if "=" in d else (d[2:], "") for d in slurm.directives]
    # srun runs this in every node's own shell, where $SLURM_NODEID and the head address expand.
    # Each node appends to its own node<R>.log in the run directory, as over SSH: logs reads them alike.
    # Slurm signals every process of the step: torchrun must ignore SIGUSR2 (its default action
    # is to die) and hand the ignoring on; the workers install their own handler for it.
    via = overrides.slurm_via or slurm.via
    _check_slurm_submission(profile, source, overrides.slurm_time or slurm.time, requeue, via)
    # submitit always asks for SIGUSR2 ahead of the time limit (--signal=USR2@...), requeue or not.
    ignore = "trap '' USR2 && " if requeue or via == "submitit" else ""
    command = (f'cd "$FSDPCTL_RUN_DIR" && export FSDPCTL_NODE_RANK="$SLURM_NODEID" && {ignore}'
               f'{{ echo "fsdpctl: node $SLURM_NODEID of {num_nodes} on $(hostname) in $PWD, '
               f'attempt $((${{SLURM_RESTART_COUNT:-0}} + 1))"; '
               f'exec "$FSDPCTL_PYTHON" {shell_join(step_args)}; }} >> node"$SLURM_NODEID".log 2>&1')
    return SlurmPlan(directives=tuple(directives), step_command=command, nodes=num_nodes, requeue=requeue,
                     signal_seconds=slurm.signal_seconds, via=via)
