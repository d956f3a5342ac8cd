"""From a profile and the command line to a launch plan: every value the scripts need.

``make_plan`` is pure: no network, no clock, no subprocess, no file access. The run id, the
local run directory and the local interpreter are passed in, so the same inputs always give the
same plan (and the same rendered scripts). Where the nodes are, and what only a backend knows (a
scheduler's directives), the backend's class says (``Placer``); everything else is decided here,
alike for every backend.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import shlex
from collections.abc import Mapping
from typing import Any, Optional

from .. import __version__
from ..errors import UsageError
from ..profiles.schema import ClusterProfile, ContainerSpec
from ..shell import NodeExpr, join_path, quote_path
from ..workload import REQUIREMENTS
from ..workload import config as train_config
from .elastic import elastic_env, elastic_settings
from .export import export_plan
from .types import ContainerPlan, LaunchPlan, NodeSpec, NodeTarget, Overrides, Placement, Placer, PlanContext

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


def is_ip(text: str) -> bool:
    """An IP address (not a name a node would resolve)."""
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def _resolve_train(profile: ClusterProfile, overrides: Overrides, placement: Placement) -> dict[str, Any]:
    for name, fix in _PLAN_OWNED_SETTINGS.items():
        if name in profile.train or name in overrides.train:
            raise UsageError(f"train.{name}: set by fsdpctl for every run", fix)
    settings: dict[str, Any] = {"device": profile.device, "cache_dir": "../../cache"}
    settings.update(profile.train)
    settings.update(overrides.train)
    for name, value in placement.train_defaults.items():
        settings.setdefault(name, value)
    settings.update(placement.train)
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
    env["FSDPCTL_STOP_SIGNAL"] = f"SIG{profile.stop_signal}"
    return env


def telemetry_env(profile: ClusterProfile, overrides: Overrides) -> dict[str, str]:
    """What a user's program's ranks are told of fsdpctl's telemetry (``fsdpctl.node.telemetry``): on
    or off, the tokens of a step, the FLOPs of a token, NCCL's timing (the profile's own ``env`` may
    still set it)."""
    spec = profile.telemetry
    if not (overrides.telemetry if overrides.telemetry is not None else spec.enabled):
        return {"FSDPCTL_TELEMETRY": "0"}
    env = {"FSDPCTL_TELEMETRY": "1"}
    tokens = overrides.tokens_per_step or spec.tokens_per_step
    if tokens:
        env["FSDPCTL_TOKENS_PER_STEP"] = str(tokens)
    flops = overrides.flops_per_token or spec.flops_per_token
    if flops:
        env["FSDPCTL_FLOPS_PER_TOKEN"] = repr(float(flops))
    if spec.nccl_timing:
        env["TORCH_NCCL_ENABLE_TIMING"] = "1"
    return env


def interface_env(name: str) -> dict[str, str]:
    """The card the nodes talk over: NCCL's exact-match form (a plain name is a prefix to NCCL: ``eth0``
    also matches ``eth0.100``), Gloo's plain name (Gloo wants the exact name)."""
    return {"NCCL_SOCKET_IFNAME": f"={name}", "GLOO_SOCKET_IFNAME": name}


def _node_nproc(profile: ClusterProfile, overrides: Overrides, gpus: Optional[int],
                target: Optional[NodeTarget] = None) -> str:
    """A node's processes: ``--nproc-per-node``, else its host's own ``nproc`` or chosen GPUs, else the
    profile's ``nproc_per_node``, else its GPU count (``gpu``: torchrun counts them at start)."""
    if overrides.nproc_per_node is not None:
        return str(overrides.nproc_per_node)
    if target is not None and target.own_nproc:
        return str(target.own_nproc)
    if isinstance(profile.nproc_per_node, int):
        return str(profile.nproc_per_node)
    if gpus is not None:
        return str(gpus)
    return "gpu"


def torchrun_args(plan: LaunchPlan, *, node_rank: str, nproc: str, master_addr: Optional[str] = None,
                  local_addr: Optional[str] = None) -> tuple[str, ...]:
    """torchrun's arguments for one node of ``plan`` (``node_rank``, ``master_addr``: a ``NodeExpr``
    where they are only known on the node, as under a scheduler), then what every rank runs."""
    master_addr = plan.master_addr if master_addr is None else master_addr
    args = ["-m", "torch.distributed.run", "--nnodes", str(plan.num_nodes),
            "--nproc-per-node", nproc, "--rdzv-id", plan.run_id]
    if plan.rdzv_backend == "standalone":
        # One node: torchrun picks a free port itself, so concurrent local runs never collide.
        args += ["--standalone"]
    elif plan.rdzv_backend == "static":
        # static's store waits ``timeout`` for every node (its default: 600 s, unsaid)
        args += ["--rdzv-backend", "static", "--master-addr", master_addr,
                 "--master-port", str(plan.master_port), "--node-rank", node_rank,
                 "--rdzv-conf", f"timeout={plan.rdzv_timeout}"]
    else:
        endpoint = (NodeExpr(f"{master_addr}:{plan.master_port}") if isinstance(master_addr, NodeExpr)
                    else f"{master_addr}:{plan.master_port}")
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                 "--rdzv-conf", f"join_timeout={plan.rdzv_timeout}"]
    if local_addr:
        args += ["--local-addr", local_addr]
    # torchrun's log folder in the run directory, wherever the ranks start.
    log_dir = NodeExpr(f'"$FSDPCTL_RUN_DIR"/logs/node{node_rank}')
    args += ["--max-restarts", "0", "--log-dir", log_dir, "--tee", "3", *plan.entry]
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


def _job(profile: ClusterProfile, overrides: Overrides, placement: Placement
         ) -> tuple[dict[str, Any], tuple[str, ...], str, tuple[str, ...]]:
    """What runs on every rank: the workload's settings (none for a user's program), torchrun's
    script and arguments, the folder the ranks start in, and the requirements to check."""
    if overrides.command:
        chdir = "code" if overrides.code is not None else (overrides.chdir or ".")
        return {}, _user_entry(tuple(overrides.command)), chdir, ("torch", *overrides.requirements)
    if overrides.entry_module:  # a module of the workload run on its own (the collective smoke test)
        return {}, ("-m", overrides.entry_module, *overrides.entry_args), ".", ("torch", *overrides.requirements)
    train = _resolve_train(profile, overrides, placement)
    entry = ("-m", WORKLOAD_MODULE, *train_config.to_argv(train))
    return train, entry, ".", (*REQUIREMENTS, *overrides.requirements)


def _secrets(profile: ClusterProfile, overrides: Overrides, env: dict[str, str]) -> tuple[str, ...]:
    secrets = tuple(dict.fromkeys((*profile.secrets, *overrides.secrets)))
    for name in secrets:
        if name in env:
            raise UsageError(f"--env {name}: given as a secret and with a value (in env or --env {name}=...)",
                             "keep one: a secret's value is taken from your environment and written nowhere")
    if secrets:
        env["FSDPCTL_SECRET_NAMES"] = ",".join(secrets)  # names only: the nodes mask these values in output
    return secrets


def _nodes(plan: LaunchPlan, profile: ClusterProfile, overrides: Overrides, placement: Placement
           ) -> tuple[NodeSpec, ...]:
    nodes = []
    for rank, target in enumerate(placement.nodes):
        nproc = _node_nproc(profile, overrides, target.gpus, target)
        if target.chosen_gpus and nproc.isdigit() and int(nproc) > len(target.chosen_gpus):
            raise UsageError(f"--nproc-per-node {nproc}: {target.host} runs on {len(target.chosen_gpus)} chosen GPU(s) "
                             f"({','.join(map(str, target.chosen_gpus))})",
                             f"give --nproc-per-node {len(target.chosen_gpus)} or less, or choose more GPUs")
        env = interface_env(target.interface) if target.interface else {}
        env.update(chosen_gpus_env(target.chosen_gpus, plan.env))
        nodes.append(NodeSpec(
            node_rank=rank, host=target.host, address=target.address, nproc=nproc,
            script_path=join_path(plan.run_dir, f"node{rank}.sh"),
            torchrun_args=torchrun_args(plan, node_rank=str(rank), nproc=nproc, local_addr=target.bind),
            env=env, interface=target.interface, gpus=target.chosen_gpus))
    return tuple(nodes)


def chosen_gpus_env(gpus: tuple[int, ...], env: Mapping[str, str]) -> dict[str, str]:
    """A node's chosen GPUs for its ranks: ``CUDA_VISIBLE_DEVICES`` in nvidia-smi's numbering, which the
    profile, doctor's checks and the health samples use (CUDA's own order puts the fastest first)."""
    if not gpus:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
            **({} if "CUDA_DEVICE_ORDER" in env else {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})}


def container_plan(profile: ClusterProfile, image: str | None = None) -> ContainerPlan | None:
    """The image the ranks run in: the profile's ``container`` with ``image`` (``--container``) over its
    own; None without either."""
    spec = profile.container
    if spec is None and image is None:
        return None
    if spec is None:
        spec = ContainerSpec(image=image or "")
    return ContainerPlan(runtime=spec.runtime, image=image or spec.image, mounts=spec.mounts, options=spec.options,
                         pull=spec.pull, workdir=spec.workdir, host_python=spec.host_python, memlock=spec.memlock,
                         gpus=profile.device != "cpu", ib=profile.network.ib)


def make_plan(
    profile: ClusterProfile,
    *,
    placer: Placer,
    run_id: str,
    local_run_dir: str,
    profile_source: str = "",
    overrides: Overrides | None = None,
    local_python: str = "python3",
    home: str = "~",
    local_cwd: str = ".",
) -> LaunchPlan:
    """Compute the launch plan of a run of ``profile`` through the backend ``placer`` (its class).
    ``local_python``, ``home`` and ``local_cwd`` are this process's (``PlanContext``)."""
    overrides = overrides or Overrides()
    placement = placer.placement(profile, overrides, PlanContext(run_id=run_id, local_python=local_python,
                                                                 home=home, local_cwd=local_cwd))
    container = container_plan(profile, overrides.container_image)
    if container is not None:  # ``python`` is the image's; the hosts' own runs fsdpctl's helpers
        placement = dataclasses.replace(placement, python=profile.python or "python3")
    environment = None
    if overrides.environment is not None and container is None:  # the ranks' Python is the environment's
        environment = overrides.environment.placed(placement.workdir, placement.python)
        placement = dataclasses.replace(placement, python=environment.python)
    train, entry, chdir, requirements = _job(profile, overrides, placement)
    env = _env(profile, overrides.debug, run_id, chdir, overrides.attempt)
    export, export_env, export_requirements = export_plan(
        profile.export, tensorboard=overrides.tensorboard, prometheus=overrides.prometheus, run_id=run_id,
        local_cwd=local_cwd, home=home, bundled=not overrides.command and not overrides.entry_module)
    env.update(export_env)
    if overrides.command:
        env.update(telemetry_env(profile, overrides))
    requirements += tuple(r for r in export_requirements if r not in requirements)
    env.update(overrides.extra_env)
    secrets = _secrets(profile, overrides, env)
    env.update(placement.env)
    run_dir = join_path(placement.workdir, "runs", run_id)
    port = overrides.master_port or profile.rendezvous.port
    nproc = _node_nproc(profile, overrides, placement.gpus_per_node)
    elastic = elastic_settings(profile, overrides, placement.num_nodes)
    env.update(elastic_env(elastic, nproc, overrides.batch_limit, program=bool(overrides.command)))
    plan = LaunchPlan(
        run_id=run_id, profile_name=profile.name, profile_source=profile_source, backend=placement.backend,
        fsdpctl_version=__version__, num_nodes=placement.num_nodes, nproc_per_node=nproc, world_size=None,
        rdzv_backend=placement.rdzv_backend or profile.rendezvous.backend, master_host=placement.master_host,
        master_addr=placement.master_addr, master_port=auto_port(run_id) if port == "auto" else port,
        master_addr_is_ip=is_ip(placement.master_addr), env=env, python=placement.python, setup=profile.setup,
        workdir=placement.workdir, run_dir=run_dir, local_run_dir=local_run_dir, train=train, nodes=(),
        debug=overrides.debug, warnings=placement.warnings, requirements=requirements,
        command=tuple(overrides.command), code=overrides.code, chdir=chdir, secrets=secrets,
        node_timeout=overrides.node_timeout or profile.node_timeout,
        hang_timeout=(overrides.hang_timeout if overrides.hang_timeout is not None else profile.hang_timeout) or None,
        on_hang=overrides.on_hang or profile.on_hang, attempt=overrides.attempt,
        stop_signal=profile.stop_signal, stop_grace=profile.stop_grace,
        gpu_health=profile.health.preflight, gpu_sample_seconds=profile.health.sample_seconds,
        allow_busy_gpus=bool(overrides.allow_busy_gpus if overrides.allow_busy_gpus is not None
                             else profile.health.allow_busy_gpus),
        max_restarts=placement.max_restarts if placement.max_restarts is not None
        else overrides.max_restarts if overrides.max_restarts is not None else profile.max_restarts,
        entry=entry, container=container, export=export, rdzv_timeout=profile.rendezvous.timeout, elastic=elastic,
        environment=environment,
    )
    nodes = _nodes(plan, profile, overrides, placement)
    counts = [n.nproc for n in nodes] or [nproc] * plan.num_nodes
    world_size = sum(int(c) for c in counts) if all(c.isdigit() for c in counts) else None
    if len(set(counts)) > 1:  # uneven nodes: "2+1" says each one's share
        nproc = "+".join(counts)
        _refuse_uneven(train)
    return placer.finish_plan(profile, overrides, dataclasses.replace(plan, nodes=nodes, world_size=world_size,
                                                                      nproc_per_node=nproc))


def _refuse_uneven(train: Mapping[str, Any]) -> None:
    """Hybrid sharding meshes the ranks as nodes x ranks per node, which uneven nodes do not make."""
    if train.get("sharding") == "hybrid":
        raise UsageError("--sharding hybrid: the nodes run different numbers of ranks (hosts[].nproc or gpus)",
                         "use --sharding full or grad-op, or give every node the same number of ranks")
