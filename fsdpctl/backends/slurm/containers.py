"""The ranks of a Slurm step inside a container image: Pyxis's ``srun --container-*`` flags, or
Docker, Podman or Apptainer started by the step on every node. Pure: shell text and words only."""

from __future__ import annotations

from ...container import runtime
from ...plan.types import ContainerPlan
from ...shell import NodeExpr, join_path, quote_path, shell_join

STEP_NAME = 'fsdpctl-{run_id}-node"$SLURM_NODEID"-s"${{SLURM_STEP_ID:-0}}"'
"""A step's container on a node: named after the run, the node and the step (a job with spares, or
requeued, runs several)."""
SLURM_NAMES = ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID", "SLURM_RESTART_COUNT", "SLURM_JOB_NODELIST",
               "CUDA_VISIBLE_DEVICES", "FSDPCTL_SLURM_STEP")
"""What Slurm tells a step that the ranks inside still see (a name unset on the node stays unset)."""


def pyxis_flags(container: ContainerPlan, run_dir: str, workdir: str, chdir: str) -> tuple[str, ...]:
    """``srun``'s Pyxis flags: the image, the run directory and the workload's data cache mounted at
    their own paths (and the folder the ranks start in, when it is outside), starting in the run directory."""
    mounts = [f"{run_dir}:{run_dir}", f"{join_path(workdir, 'cache')}:{join_path(workdir, 'cache')}"]
    if chdir.startswith("/"):
        mounts.append(f"{chdir}:{chdir}")
    mounts += list(container.mounts)
    return (f"--container-image={container.image}", f"--container-mounts={','.join(mounts)}",
            f"--container-workdir={container.workdir or run_dir}", *container.options)


def step_python(container: ContainerPlan | None, python: str) -> str:
    """How the step names the Python of fsdpctl's helpers beside the ranks (the mask, the GPU sampler):
    the batch script's ``$FSDPCTL_PYTHON`` (the hosts' own), or inside a Pyxis container the image's."""
    return quote_path(python) if container is not None and container.runtime == "pyxis" else '"$FSDPCTL_PYTHON"'


def step_torchrun(container: ContainerPlan | None, run_id: str, python: str, step_args: tuple[str, ...],
                  env_names: list[str], chdir: str) -> tuple[str, bool]:
    """The shell text that runs torchrun on a node, and whether the step may ``exec`` it: without a
    container or with Pyxis, the image's ``python`` itself; with a runtime, the node starts the image
    (every GPU and the IB devices where the node has them) and removes the container when the step is
    stopped (Slurm's signal reaches the runtime's client, not a daemon's container)."""
    torchrun = f"{quote_path(python)} {shell_join(step_args)}"
    if container is None or container.runtime == "pyxis":
        return (torchrun if container else f'"$FSDPCTL_PYTHON" {shell_join(step_args)}'), True
    name = NodeExpr(STEP_NAME.format(run_id=run_id))
    labels = {runtime.LABEL_RUN: run_id, runtime.LABEL_NODE: '"$SLURM_NODEID"'}
    words = runtime.run_words(container, name=name, labels=labels, env_names=[*env_names, *SLURM_NAMES],
                              chdir=chdir, workdir=NodeExpr('"$PWD"'))
    flags = "flags=(); "
    if runtime.gpu_flags(container):
        flags += f"[ -e /dev/nvidiactl ] && flags+=({shell_join(runtime.gpu_flags(container))}); "
    if runtime.ib_flags(container):
        flags += f"[ -d /dev/infiniband ] && flags+=({shell_join(runtime.ib_flags(container))}); "
    cache = f'{runtime.DATA_CACHE}; mkdir -p "$FSDPCTL_DATA_CACHE"; '
    start = f'{shell_join(words)} "${{flags[@]}}" {quote_path(container.image)} {torchrun}'
    if container.runtime not in runtime.DAEMON_RUNTIMES:
        return f"{cache}{flags}{start}", True
    remove = f"{container.runtime} rm -f {name} >/dev/null 2>&1"
    return (f"{cache}{flags}{start} & client=$!; trap '{remove}; exit 143' TERM INT; "
            f"wait $client; code=$?; trap - TERM INT; {remove}; (exit $code)"), False
