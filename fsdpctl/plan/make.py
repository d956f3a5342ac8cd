"""From a profile and the command line to a launch plan: every value the scripts need.

``make_plan`` is pure: no network, no clock, no subprocess, no file access. The run id, the
local run directory and the local interpreter are passed in, so the same inputs always give the
same plan (and the same rendered scripts).
"""

from __future__ import annotations

import ipaddress
import shlex
from typing import Any, Optional

from .. import __version__
from ..errors import UsageError
from ..profiles.schema import ClusterProfile
from ..shell import NodeExpr, join_path, quote_path
from ..workload import REQUIREMENTS
from ..workload import config as train_config
from .slurm import make_slurm_plan
from .types import LaunchPlan, NodeSpec, Overrides

WORKLOAD_MODULE = "fsdpctl.workload.train"
SHIPPED_PACKAGE_DIR = "pkg"
STARTUP_HOOK_DIR = f"{SHIPPED_PACKAGE_DIR}/fsdpctl/node/startup"
# torch's flight recorder: the last collectives of every process group, kept in memory, dumped by NCCL's
# watchdog on a timeout and by fsdpctl's hook on demand. The TORCH_FR_* names (torch 2.7 and later;
# the older TORCH_NCCL_* ones make torch warn on every rank).
FLIGHT_RECORDER_ENTRIES = "2000"
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL", "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
# Settings of the workload that fsdpctl owns, and what to do instead.
_PLAN_OWNED_SETTINGS = {
    "run_dir": "remove it; each run writes into <workdir>/runs/<run_id>/",
    "resume": "remove it; continue a run in its own directory with `fsdpctl launch --resume RUN_ID`",
}


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True



def _resolve_train(profile: ClusterProfile, overrides: Overrides, *, for_slurm: bool,
                   requeue: bool) -> dict[str, Any]:
    for name, fix in _PLAN_OWNED_SETTINGS.items():
        if name in profile.train or name in overrides.train:
            raise UsageError(f"train.{name}: set by fsdpctl for every run", fix)
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
    if overrides.attempt > 1:
        # A later attempt continues in the same run directory from its newest complete checkpoint;
        # fsdpctl has checked that one exists before planning it.
        settings["resume"] = True
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


def _pythonpath(chdir: str, extra: Optional[str]) -> NodeExpr:
    """The ranks' PYTHONPATH, expanded on the node: fsdpctl's start-up hook (a ``sitecustomize``:
    stack dumps on demand and on a crash, flight-recorder dumps), the folder they start in (the
    user's code), the shipped package (the workload: a node needs nothing of fsdpctl installed and
    always runs the launcher's own version of it), then the profile's own entries."""
    parts = [f'"$FSDPCTL_RUN_DIR"/{STARTUP_HOOK_DIR}']
    parts += [] if chdir == "." else [f'"$FSDPCTL_RUN_DIR"/{shlex.quote(chdir)}' if not chdir.startswith(("/", "~"))
                                     else quote_path(chdir)]
    parts.append(f'"$FSDPCTL_RUN_DIR"/{SHIPPED_PACKAGE_DIR}')
    if extra:
        parts.append(shlex.quote(extra))
    return NodeExpr(":".join(parts))


def _env(profile: ClusterProfile, debug: bool, run_id: str, chdir: str, attempt: int) -> dict[str, str]:
    env: dict[str, str] = {
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": _pythonpath(chdir, profile.env.get("PYTHONPATH")),
        # Every line a worker prints starts with its global rank: logs can be filtered by rank.
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]:",
        "TORCH_FR_BUFFER_SIZE": FLIGHT_RECORDER_ENTRIES,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": NodeExpr('"$FSDPCTL_RUN_DIR"/flight/on-timeout/rank_'),
    }
    net = profile.network
    if net.interface:
        env.update(interface_env(net.interface))
    if net.ib:
        if net.ib_hca:
            env["NCCL_IB_HCA"] = net.ib_hca
    else:
        env["NCCL_IB_DISABLE"] = "1"
        env["NCCL_NET"] = "Socket"  # a net plugin (aws-ofi-nccl, HPC-X's) would otherwise try RDMA
    if debug:
        env.update(DEBUG_ENV)
    env.update({k: v for k, v in profile.env.items() if k != "PYTHONPATH"})  # may override the defaults
    env["FSDPCTL_RUN_ID"] = run_id
    env["FSDPCTL_ATTEMPT"] = str(attempt)
    return env


def interface_env(name: str) -> dict[str, str]:
    """The card the nodes talk over: NCCL's exact-match form (a plain name is a prefix to NCCL: ``eth0``
    also matches ``eth0.100``), Gloo's plain name (Gloo wants the exact name)."""
    return {"NCCL_SOCKET_IFNAME": f"={name}", "GLOO_SOCKET_IFNAME": name}


def _node_nproc(profile: ClusterProfile, overrides: Overrides, gpus: Optional[int]) -> str:
    if overrides.nproc_per_node is not None:
        return str(overrides.nproc_per_node)
    if isinstance(profile.nproc_per_node, int):
        return str(profile.nproc_per_node)
    if gpus is not None:
        return str(gpus)
    return "gpu"


def _torchrun_args(*, num_nodes: int, run_id: str, rdzv_backend: str, master_addr: str, master_port: int,
                   node_rank: str, local_addr: Optional[str], nproc: str, entry: tuple[str, ...]) -> tuple[str, ...]:
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
    # torchrun's log folder in the run directory, wherever the ranks start.
    log_dir = NodeExpr(f'"$FSDPCTL_RUN_DIR"/logs/node{node_rank}')
    args += ["--max-restarts", "0", "--log-dir", log_dir, "--tee", "3", *entry]
    return tuple(args)


def _user_entry(command: tuple[str, ...]) -> tuple[str, ...]:
    """torchrun's training script and its arguments for ``SCRIPT.py ARGS`` or ``-m MODULE ARGS``."""
    if command[0] in ("-m", "--module"):
        if len(command) < 2 or not command[1] or command[1].startswith("-"):
            raise UsageError("-m: no module named after it", "write e.g. -- -m mypackage.train --lr 3e-4")
        return ("-m", *command[1:])
    if command[0].startswith("-"):
        raise UsageError(f"{command[0]}: the command must start with a script or -m MODULE",
                         "write e.g. -- train.py --epochs 3, or -- -m mypackage.train")
    return command


def _job(profile: ClusterProfile, overrides: Overrides, *, for_slurm: bool, requeue: bool
         ) -> tuple[dict[str, Any], tuple[str, ...], str, tuple[str, ...]]:
    """What runs on every rank: the workload's settings (none for a user's program), torchrun's
    script and arguments, the folder the ranks start in, and the requirements to check."""
    if overrides.command:
        chdir = "code" if overrides.code is not None else (overrides.chdir or ".")
        return {}, _user_entry(tuple(overrides.command)), chdir, ("torch", *overrides.requirements)
    if overrides.entry_module:  # a module of the workload run on its own (the collective smoke test)
        return {}, ("-m", overrides.entry_module, *overrides.entry_args), ".", ("torch", *overrides.requirements)
    train = _resolve_train(profile, overrides, for_slurm=for_slurm, requeue=requeue)
    entry = ("-m", WORKLOAD_MODULE, *train_config.to_argv(train))
    return train, entry, ".", (*REQUIREMENTS, *overrides.requirements)


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
    if not for_slurm and profile.scheduled:
        raise UsageError(f"profile {profile.name}: is a Slurm profile",
                         f"use `fsdpctl submit --slurm --profile {profile.name}`")
    requeue = False
    if for_slurm:
        assert profile.slurm is not None
        requeue = profile.slurm.requeue if overrides.slurm_requeue is None else overrides.slurm_requeue
    train, entry, chdir, requirements = _job(profile, overrides, for_slurm=for_slurm, requeue=requeue)
    env = _env(profile, overrides.debug, run_id, chdir, overrides.attempt)
    env.update(overrides.extra_env)
    secrets = tuple(dict.fromkeys((*profile.secrets, *overrides.secrets)))
    for name in secrets:
        if name in env:
            raise UsageError(f"--env {name}: given as a secret and with a value (in env or --env {name}=...)",
                             "keep one: a secret's value is taken from your environment and written nowhere")
    if secrets:
        env["FSDPCTL_SECRET_NAMES"] = ",".join(secrets)  # names only: the nodes mask these values in output
    if requeue and overrides.command:
        # Your program asks for a requeue as the workload does: after SIGUSR2, save, leave this file, exit 0.
        env["FSDPCTL_REQUEUE_MARKER"] = NodeExpr(f'"$FSDPCTL_RUN_DIR"/{train_config.REQUEUE_MARKER}')
    python = profile.python or (local_python if profile.on_this_machine else "python3")
    workdir = profile.workdir
    if profile.on_this_machine and not workdir.startswith(("/", "~")):
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
        if profile.on_this_machine:
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

    rdzv_backend = "standalone" if profile.on_this_machine else profile.rendezvous.backend
    rdzv = {"num_nodes": num_nodes, "run_id": run_id, "rdzv_backend": rdzv_backend, "master_port": port,
            "entry": entry}
    nodes = []
    for rank, (host, address, explicit_addr) in enumerate(hosts):
        gpus = None if profile.on_this_machine else profile.hosts[rank].gpus
        node_nproc = _node_nproc(profile, overrides, gpus)
        nodes.append(NodeSpec(
            node_rank=rank, host=host, address=address, nproc=node_nproc,
            script_path=join_path(run_dir, f"node{rank}.sh"),
            torchrun_args=_torchrun_args(**rdzv, master_addr=master_addr, node_rank=str(rank),
                                         local_addr=explicit_addr, nproc=node_nproc),
            env=interface_env(profile.hosts[rank].interface)
            if not profile.on_this_machine and profile.hosts[rank].interface else {},
        ))
    counts = [n.nproc for n in nodes] if nodes else [nproc] * num_nodes
    world_size = sum(int(c) for c in counts) if all(c.isdigit() for c in counts) else None

    slurm_plan = None
    if for_slurm:
        step_args = _torchrun_args(**rdzv, master_addr=NodeExpr('"$FSDPCTL_HEAD_ADDR"'),
                                   node_rank=NodeExpr('"$SLURM_NODEID"'), local_addr=None, nproc=nproc)
        slurm_plan = make_slurm_plan(profile, overrides, run_id, run_dir, num_nodes, step_args, requeue,
                                     profile_source, chdir, secrets)
    return LaunchPlan(
        run_id=run_id, profile_name=profile.name, profile_source=profile_source,
        backend="slurm" if for_slurm else profile.backend, fsdpctl_version=__version__,
        num_nodes=num_nodes, nproc_per_node=nproc, world_size=world_size,
        rdzv_backend=rdzv_backend, master_host=master_host, master_addr=master_addr,
        master_port=port, master_addr_is_ip=_is_ip(master_addr), env=env, python=python,
        setup=profile.setup, workdir=workdir, run_dir=run_dir, local_run_dir=local_run_dir,
        train=train, nodes=tuple(nodes), slurm=slurm_plan, debug=overrides.debug,
        warnings=tuple(warnings), requirements=requirements, command=tuple(overrides.command),
        code=overrides.code, chdir=chdir, secrets=secrets,
        node_timeout=overrides.node_timeout or profile.node_timeout,
        hang_timeout=(overrides.hang_timeout if overrides.hang_timeout is not None else profile.hang_timeout) or None,
        on_hang=overrides.on_hang or profile.on_hang, attempt=overrides.attempt,
        # Slurm restarts a job itself (requeue); fsdpctl's restarts are a launcher's.
        max_restarts=0 if for_slurm else overrides.max_restarts if overrides.max_restarts is not None
        else profile.max_restarts,
    )

