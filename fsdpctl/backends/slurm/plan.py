"""The Slurm part of a plan: where a job's nodes are (Slurm allocates them), the ``#SBATCH``
directives, and the step command every node runs.

Pure, like the rest of the plan: the batch script is rendered from what these functions return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ...errors import UsageError
from ...plan.elastic_policy import min_nodes_in
from ...plan.environment import STAGED_ENVIRONMENT
from ...plan.make import torchrun_args
from ...plan.types import ContainerPlan, LaunchPlan, Overrides, Placement, PlanContext
from ...profiles.schema import SLURM_OWNED_DIRECTIVES, ClusterProfile, SlurmSpec, slurm_directive_name
from ...shell import NodeExpr, join_path, quote_path
from ...workload import config as train_config
from .containers import pyxis_flags, step_python, step_torchrun

HEAD_ADDR = NodeExpr('"$FSDPCTL_HEAD_ADDR"')
"""The first node's address, found by the batch script at run time."""
HEAD_ADDR_NAME = "$FSDPCTL_HEAD_ADDR"
"""How the plan names the head's address (it is known only inside the job)."""
NODE_RANK = NodeExpr('"$SLURM_NODEID"')
"""A node's rank, expanded in the node's own shell (never at submit time)."""
STEP_NODES = NodeExpr('"$SLURM_STEP_NUM_NODES"')
"""The nodes of the step a node runs in: an elastic job's later steps may run on fewer than the plan's."""
OPTIONS = ("nodes", "time", "partition", "requeue", "via", "spares")
"""What ``submit`` may set over the profile's slurm section (``Overrides.backend_options``)."""


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
    spares: int = 0
    """Nodes held beyond ``nodes`` (``--no-kill``): a failed node's place is taken by one of them and
    the next step runs in the same allocation (``fsdpctl.node.slurm_steps``)."""
    gpus_per_node: int = 0
    """What a node's re-check expects to see before it runs a step."""
    srun_flags: tuple[str, ...] = ()
    """More flags for the step's ``srun`` (Pyxis's ``--container-image`` and its mounts)."""
    min_nodes: int = 0
    """An elastic job (``elastic.min_nodes``, ``--min-nodes``): when a node is to blame and no spare
    is left, the next step runs on the healthy nodes, as long as at least this many remain (0: off)."""
    environment_step: str = ""
    """The step that makes the environment on every allocated node before the ranks start (the
    wheels fsdpctl put in the run directory; ``fsdpctl.node.envs``); empty without one."""

    @property
    def runs_steps(self) -> bool:
        """The batch script runs ``fsdpctl.node.slurm_steps`` (``--no-kill``), not one ``srun``."""
        return bool(self.spares or self.min_nodes)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, plan: LaunchPlan) -> SlurmPlan:
        """The Slurm part of ``plan`` (as ``finish_plan`` left it in ``backend_plan``)."""
        data = dict(plan.backend_plan)
        if not data:
            raise UsageError(f"run {plan.run_id}: its plan has no Slurm part", "submit it with fsdpctl submit --slurm")
        return cls(**{**data, "directives": tuple(map(tuple, data["directives"])),
                      "srun_flags": tuple(data.get("srun_flags", ()))})


def options(overrides: Overrides) -> Mapping[str, Any]:
    """``submit``'s settings over the profile's slurm section; any other is refused in one line."""
    unknown = sorted(set(overrides.backend_options) - set(OPTIONS))
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: not a setting of a Slurm job", f"give only {', '.join(OPTIONS)}")
    return overrides.backend_options


def spares_of(slurm: SlurmSpec, overrides: Overrides) -> int:
    """The spare nodes a job holds: ``--spares`` over ``slurm.spares``."""
    value = options(overrides).get("spares")
    if value is not None and (not isinstance(value, int) or value < 0):
        raise UsageError(f"--spares: {value!r} is not a count of nodes", "give 0 or more, e.g. --spares 1")
    return slurm.spares if value is None else value


def requeues(slurm: SlurmSpec, overrides: Overrides) -> bool:
    value = options(overrides).get("requeue")
    return slurm.requeue if value is None else bool(value)


def slurm_placement(name: str, profile: ClusterProfile, overrides: Overrides, context: PlanContext) -> Placement:
    """Slurm allocates the nodes when the job starts: how many, the GPUs each has, the head node's
    address found there; paths Slurm reads itself with ``~`` expanded (it does not). Slurm runs the
    same script again when it requeues a job (preemption, node failure, ``--requeue``): the workload
    then continues from its newest checkpoint instead of refusing, and with ``requeue`` it saves one
    on SIGUSR2. A launcher never restarts a Slurm job: Slurm requeues it."""
    if profile.slurm is None:
        raise UsageError(f"profile {profile.name}: has no slurm section",
                         "add slurm: {nodes: N, ...} to the profile, or use `fsdpctl launch`")
    slurm, given = profile.slurm, options(overrides)
    requeue = requeues(slurm, overrides)
    train: dict[str, Any] = {}
    env: dict[str, str] = {}
    if requeue:
        if not overrides.command and {**profile.train, **overrides.train}.get("no_checkpoint"):
            raise UsageError("requeue: a requeued job resumes from a checkpoint, and train.no_checkpoint is set",
                             "drop no_checkpoint, or submit without --requeue")
        train["checkpoint_on_signal"] = True
        if overrides.command:
            # Your program asks for a requeue as the workload does: after SIGUSR2, save, leave this file, exit 0.
            env["FSDPCTL_REQUEUE_MARKER"] = NodeExpr(f'"$FSDPCTL_RUN_DIR"/{train_config.REQUEUE_MARKER}')
    workdir = profile.workdir
    if workdir.startswith("~"):
        workdir = join_path(context.home, workdir[2:]) if workdir != "~" else context.home
    return Placement(backend=name, num_nodes=given.get("nodes") or slurm.nodes, gpus_per_node=slurm.gpus_per_node,
                     master_host=HEAD_ADDR_NAME, master_addr=HEAD_ADDR_NAME, python=profile.python or "python3",
                     workdir=workdir, train_defaults={"resume_if_present": True}, train=train, env=env,
                     max_restarts=0)


def finish_slurm_plan(profile: ClusterProfile, overrides: Overrides, plan: LaunchPlan) -> LaunchPlan:
    """The plan with its Slurm part: every node runs the same step, its rank expanded on the node."""
    step_args = torchrun_args(plan, node_rank=NODE_RANK, nproc=plan.nproc_per_node, master_addr=HEAD_ADDR)
    min_nodes = min_nodes_in(plan.elastic)
    if min_nodes:  # a later step may run on fewer nodes: torchrun waits for the step's own
        at = step_args.index("--nnodes") + 1
        step_args = (*step_args[:at], STEP_NODES, *step_args[at + 1:])
    slurm_plan = make_slurm_plan(profile, overrides, plan.run_id, plan.run_dir, plan.num_nodes, step_args,
                                 requeues(profile.slurm, overrides), plan.profile_source, plan.chdir, plan.secrets,
                                 plan.gpu_sample_seconds, container=plan.container, python=plan.python,
                                 env_names=[*plan.env, "FSDPCTL_RUN_DIR", "FSDPCTL_NODE_RANK", *plan.secrets],
                                 workdir=plan.workdir, min_nodes=min_nodes)
    if plan.environment is not None:
        slurm_plan = dataclasses.replace(slurm_plan, environment_step=environment_step(plan))
    return dataclasses.replace(plan, backend_plan=slurm_plan.to_json(), shared_run_dir=True)


def environment_step(plan: LaunchPlan) -> str:
    """One task on every allocated node (spares too) runs the node's side of the environment, from
    what the launcher staged in the run directory; a node whose environment is made says so and goes on."""
    import json
    import shlex

    env = plan.environment
    assert env is not None
    args = {"root": env.root, "name": env.name, "base": env.base_python, "mode": "staged",
            "staged": join_path(plan.run_dir, STAGED_ENVIRONMENT)}
    return (f'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 '
            f'env PYTHONPATH="$FSDPCTL_RUN_DIR"/pkg {quote_path(env.base_python)} -m fsdpctl.node.envs '
            f'{shlex.quote(json.dumps(args, sort_keys=True))}')



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


def make_slurm_plan(profile: ClusterProfile, overrides: Overrides, run_id: str, run_dir: str,
                    num_nodes: int, step_args: tuple[str, ...], requeue: bool, source: str,
                    chdir: str = ".", secrets: tuple[str, ...] = (), sample_seconds: float = 0.0, *,
                    container: ContainerPlan | None = None, python: str = "python3", env_names: Sequence[str] = (),
                    workdir: str = "~", min_nodes: int = 0) -> SlurmPlan:
    slurm = profile.slurm
    assert slurm is not None
    spares = spares_of(slurm, overrides)
    directives: list[tuple[str, str]] = [
        ("job-name", f"fsdpctl-{run_id}"), ("nodes", str(num_nodes + spares)), ("ntasks-per-node", "1"),
    ]
    if spares or min_nodes:
        directives.append(("no-kill", ""))  # a failed node leaves the allocation; the job goes on without it
    optional = {
        "gpus-per-node": slurm.gpus_per_node, "cpus-per-task": slurm.cpus_per_task,
        "partition": options(overrides).get("partition") or slurm.partition, "account": slurm.account,
        "qos": slurm.qos, "time": options(overrides).get("time") or slurm.time, "constraint": slurm.constraint,
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
    via = options(overrides).get("via") or slurm.via
    _check_slurm_submission(profile, source, options(overrides).get("time") or slurm.time, requeue, via)
    if spares and via == "submitit":
        raise UsageError(f"{source or profile.name}: slurm.spares: submitit starts the step on every node it "
                         "allocates, so it cannot hold spares", "submit with --via sbatch, or without spares")
    if min_nodes and via == "submitit":
        raise UsageError(f"{source or profile.name}: elastic.min_nodes: submitit starts the step on every node it "
                         "allocates, so it cannot go on with fewer", "submit with --via sbatch, or without elastic")
    # submitit always asks for SIGUSR2 ahead of the time limit (--signal=USR2@...), requeue or not.
    # The same for the profile's stop signal (`fsdpctl stop` sends it to every process of the steps),
    # unless it is TERM: torchrun's own handler hands that on to the ranks and waits for them.
    ignored = (["USR2"] if requeue or via == "submitit" else []) + ([profile.stop_signal]
                                                                   if profile.stop_signal != "TERM" else [])
    ignore = f"trap '' {' '.join(ignored)} && " if ignored else ""
    enter = "" if chdir == "." else f"cd {quote_path(chdir)} || exit 1; "  # the user's code: ranks start there
    # An elastic job's step may run on fewer nodes than the plan's, and says how often that changed.
    of, changes = ("$SLURM_STEP_NUM_NODES", ", node count changed $FSDPCTL_ELASTIC_ATTEMPT time(s)") if min_nodes \
        else (str(num_nodes), "")
    announce = (f'echo "fsdpctl: node $SLURM_NODEID of {of} on $(hostname) in $PWD, '
                f'Slurm start $((${{SLURM_RESTART_COUNT:-0}} + 1))'
                f'${{FSDPCTL_SLURM_STEP:+, step $FSDPCTL_SLURM_STEP}}{changes}"; ')  # a job with spares runs steps
    # With a container, torchrun is the image's (Pyxis: the whole step runs inside it).
    torchrun, may_exec = step_torchrun(container, run_id, python, step_args, list(dict.fromkeys(env_names)), chdir)
    helper = step_python(container, python)
    # Every GPU sampled beside the ranks (fsdpctl.node.gpu_watch; nothing on a node without nvidia-smi).
    announce += (f'{helper} -m fsdpctl.node.gpu_watch --out "$FSDPCTL_RUN_DIR/gpu/node$SLURM_NODEID.jsonl" '
                 f'--every {sample_seconds:g} --parent $$ --node "$SLURM_NODEID" --host "$(hostname)" </dev/null & '
                 if sample_seconds else "")
    if secrets:
        # What the ranks print passes the node's mask on its way to the log; torchrun's own per-rank
        # copies are masked once it ends (so it is not exec'd: the shell waits for it).
        mask = f'{helper} -m fsdpctl.node.mask'
        command = (f'set -o pipefail && cd "$FSDPCTL_RUN_DIR" && export FSDPCTL_NODE_RANK="$SLURM_NODEID" && '
                   f'{ignore}{{ {enter}{announce}{torchrun}; code=$?; '
                   f'{mask} --scrub "$FSDPCTL_RUN_DIR"/logs/node"$SLURM_NODEID"; exit $code; }} 2>&1 | '
                   f'{mask} >> node"$SLURM_NODEID".log')
    else:
        command = (f'cd "$FSDPCTL_RUN_DIR" && export FSDPCTL_NODE_RANK="$SLURM_NODEID" && {ignore}'
                   f'{{ {enter}{announce}{"exec " if may_exec else ""}{torchrun}; }} >> node"$SLURM_NODEID".log 2>&1')
    return SlurmPlan(directives=tuple(directives), step_command=command, nodes=num_nodes, requeue=requeue,
                     signal_seconds=slurm.signal_seconds, via=via, spares=spares, min_nodes=min_nodes,
                     gpus_per_node=slurm.gpus_per_node or 0,
                     srun_flags=pyxis_flags(container, run_dir, workdir, chdir)
                     if container is not None and container.runtime == "pyxis" else ())
