"""The Slurm part of a plan: the ``#SBATCH`` directives and the step command every node runs.

Pure, like the rest of the plan: the batch script is rendered from what these functions return.
"""

from __future__ import annotations

from typing import Optional

from ..errors import UsageError
from ..profiles.schema import SLURM_OWNED_DIRECTIVES, ClusterProfile, slurm_directive_name
from ..shell import join_path, quote_path, shell_join
from .types import Overrides, SlurmPlan


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
                    chdir: str = ".", secrets: tuple[str, ...] = ()) -> SlurmPlan:
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
    enter = "" if chdir == "." else f"cd {quote_path(chdir)} || exit 1; "  # the user's code: ranks start there
    announce = (f'echo "fsdpctl: node $SLURM_NODEID of {num_nodes} on $(hostname) in $PWD, '
                f'Slurm start $((${{SLURM_RESTART_COUNT:-0}} + 1))"; ')
    torchrun = f'"$FSDPCTL_PYTHON" {shell_join(step_args)}'
    if secrets:
        # What the ranks print passes the node's mask on its way to the log; torchrun's own per-rank
        # copies are masked once it ends (so it is not exec'd: the shell waits for it).
        mask = '"$FSDPCTL_PYTHON" -m fsdpctl.node.mask'
        command = (f'set -o pipefail && cd "$FSDPCTL_RUN_DIR" && export FSDPCTL_NODE_RANK="$SLURM_NODEID" && '
                   f'{ignore}{{ {enter}{announce}{torchrun}; code=$?; '
                   f'{mask} --scrub "$FSDPCTL_RUN_DIR"/logs/node"$SLURM_NODEID"; exit $code; }} 2>&1 | '
                   f'{mask} >> node"$SLURM_NODEID".log')
    else:
        command = (f'cd "$FSDPCTL_RUN_DIR" && export FSDPCTL_NODE_RANK="$SLURM_NODEID" && {ignore}'
                   f'{{ {enter}{announce}exec {torchrun}; }} >> node"$SLURM_NODEID".log 2>&1')
    return SlurmPlan(directives=tuple(directives), step_command=command, nodes=num_nodes, requeue=requeue,
                     signal_seconds=slurm.signal_seconds, via=via)
