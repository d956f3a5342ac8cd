"""The container runtimes' command lines, in one place: what a node runs to start its ranks inside
the image, to probe inside it, to find and remove a run's containers. Pure: words and shell text only.

Docker and Podman take the same flags here; Apptainer runs the image as a plain child process (no
daemon, no container to remove: the host's network, IPC and process table are shared as they are);
Pyxis is Slurm's (``srun --container-image``) and appears in the Slurm backend's step command only.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from ..plan.types import ContainerPlan
from ..shell import NodeExpr, quote_path

DAEMON_RUNTIMES = ("docker", "podman")
"""Runtimes whose containers have names and labels, outlive the client that started them, and must be
removed by name."""
LABEL_RUN = "fsdpctl.run"
LABEL_NODE = "fsdpctl.node"
INSIDE_MARK = "FSDPCTL_CONTAINER"
"""Set inside the container (to its name): the node script's second half runs there."""
# NVIDIA's flags for every GPU of the host: Docker's --gpus (nvidia-container-toolkit), Podman's CDI
# device (nvidia-ctk cdi generate), Apptainer's --nv.
GPU_FLAGS = {"docker": ("--gpus", "all"), "podman": ("--device", "nvidia.com/gpu=all"), "apptainer": ("--nv",)}


DATA_CACHE = 'FSDPCTL_DATA_CACHE="$(dirname "$(dirname "$FSDPCTL_RUN_DIR")")/cache"'
"""Shell setting where the bundled workload's tokenizer and tokens are kept on the host
(``<workdir>/cache``, its ``cache_dir``): mounted at the same path, so they are made once per host."""


def short_digest(digest: str | None) -> str:
    """``sha256:65acd47921db`` (12 hex digits, as the runtimes show image ids)."""
    if not digest:
        return "none"
    algo, _, value = digest.partition(":")
    return f"{algo}:{value[:12]}" if value else digest[:19]


PROBE_SECONDS = 120.0
"""The least time a probe that also starts the image gets (a loaded node starts a container slowly)."""
PULL_SECONDS = 900.0
"""...and one that may pull the image first (``pull: missing`` or ``always``)."""


def probe_timeout(container: ContainerPlan | None, seconds: float) -> float:
    """How long a node's probe may take: ``seconds``, or longer when it starts (and may pull) the image."""
    if container is None:
        return seconds
    return max(seconds, PROBE_SECONDS if container.pull == "never" else PULL_SECONDS)


def container_name(run_id: str, node_rank: int | str, attempt: int) -> str:
    """The container of one node of one attempt: found, and removed, by this name."""
    return f"fsdpctl-{run_id}-node{node_rank}-a{attempt}"


def _mount(source: str, target: str, runtime: str, mode: str = "") -> list[str]:
    spec = NodeExpr(f"{source}:{target}{':' + mode if mode else ''}")
    return ["--bind" if runtime == "apptainer" else "-v", spec]


def _user_mounts(container: ContainerPlan, shell: bool = True) -> list[str]:
    """The profile's mounts: shell words for a script, or plain words (``~`` already expanded by the
    caller) for an argument list."""
    words: list[str] = []
    for mount in container.mounts:
        if not shell:
            words += ["--bind" if container.runtime == "apptainer" else "-v", mount]
            continue
        source, target, *mode = mount.split(":")
        words += _mount(quote_path(source), shlex.quote(target), container.runtime, mode[0] if mode else "")
    return words


def run_words(container: ContainerPlan, *, name: str, labels: dict[str, str], env_names: Sequence[str],
              chdir: str | None, workdir: str = NodeExpr('"$FSDPCTL_RUN_DIR"')) -> list[str]:
    """``<runtime> run ...`` up to (not including) the flags the node decides itself (GPUs, InfiniBand,
    memlock, the user): the run directory and the workdir's data cache (the bundled workload's
    ``cache_dir``, ``<workdir>/cache``: tokenizer and tokens made once per host) at their own paths, the
    host's network and
    IPC namespaces, every variable by name only (the runtime reads the values from its own environment:
    a secret is never in an argument list), starting in ``workdir``."""
    runtime = container.runtime
    run_dir = NodeExpr('"$FSDPCTL_RUN_DIR"')
    cache = NodeExpr('"$FSDPCTL_DATA_CACHE"')
    if runtime == "apptainer":
        mark = f"{INSIDE_MARK}={name}"
        words = ["apptainer", "exec", "--env", NodeExpr(mark) if isinstance(name, NodeExpr) else mark]
        words += _mount(run_dir, run_dir, runtime) + _mount(cache, cache, runtime)
        if chdir and chdir.startswith(("/", "~")):
            words += _mount(quote_path(chdir), quote_path(chdir), runtime)
        return words + _user_mounts(container) + ["--pwd", workdir, *container.options]
    words = [runtime, "run", "--rm", "--name", name, "--network", "host", "--ipc", "host",
             f"--pull={container.pull}"]
    words += [NodeExpr(f"--label={key}={value}") if isinstance(value, NodeExpr) or '"$' in value
              else f"--label={key}={value}" for key, value in labels.items()]
    words += _mount(run_dir, run_dir, runtime) + _mount(cache, cache, runtime)
    if chdir and chdir.startswith(("/", "~")):
        words += _mount(quote_path(chdir), quote_path(chdir), runtime)
    words += _user_mounts(container)
    for env_name in env_names:
        words += ["--env", env_name]
    return [*words, "--env", NodeExpr(f"{INSIDE_MARK}={name}") if isinstance(name, NodeExpr)
            else f"{INSIDE_MARK}={name}", "-w", workdir, *container.options]


def gpu_flags(container: ContainerPlan) -> tuple[str, ...]:
    """The flags that give the container every GPU of the host (added where the host has them)."""
    return GPU_FLAGS.get(container.runtime, ()) if container.gpus else ()


def ib_flags(container: ContainerPlan) -> tuple[str, ...]:
    """The InfiniBand devices (Apptainer shares the host's /dev as it is)."""
    return ("--device", "/dev/infiniband") if container.ib and container.runtime in DAEMON_RUNTIMES else ()


def user_flags(container: ContainerPlan) -> tuple[str, ...]:
    """How a non-root user runs as themself inside (written as shell: evaluated on the node)."""
    if container.runtime == "docker":
        return ("--user", NodeExpr('"$(id -u):$(id -g)"'))
    if container.runtime == "podman":  # rootless Podman maps the user to itself
        return ("--userns=keep-id",)
    return ()


def cleanup_command(runtime: str, run_id: str, node_rank: int | None = None) -> str:
    """Remove the run's containers (of one node) that are left, running or not; prints nothing."""
    if runtime not in DAEMON_RUNTIMES:
        return "true"
    filters = f"--filter label={LABEL_RUN}={shlex.quote(run_id)}"
    if node_rank is not None:
        filters += f" --filter label={LABEL_NODE}={node_rank}"
    # Its processes have had their grace by now: podman's rm -f would give each container 10 s more
    # (its stop timeout) unless told 0; a podman without --time removes them the plain way. Docker's
    # rm -f kills at once.
    remove = f"{runtime} rm -f $ids >/dev/null 2>&1"
    if runtime == "podman":
        remove = f"{{ {runtime} rm -f -t 0 $ids >/dev/null 2>&1 || {remove}; }}"
    return (f"if command -v {runtime} >/dev/null 2>&1; then ids=$({runtime} ps -aq {filters} 2>/dev/null); "
            f"[ -z \"$ids\" ] || {remove}; fi; true")


def probe_spec(container: ContainerPlan, python: str, source: str) -> dict[str, Any]:
    """What the probe's container part is told (``fsdpctl.container.probe_part``): the runtime and image,
    the image's ``python``, the words that start it for the probe, the GPU and IB flags it adds where
    the host has those devices, how long a pull and a start may take (within the probe's own time),
    and ``source``, the probe's own source (packed) to run in there."""
    return {"runtime": container.runtime, "image": container.image, "pull": container.pull, "python": python,
            "run": probe_words(container), "gpu_flags": list(gpu_flags(container)),
            "ib_flags": list(ib_flags(container)), "pull_seconds": PULL_SECONDS - PROBE_SECONDS,
            "start_seconds": PROBE_SECONDS - 20, "source": source}


def probe_words(container: ContainerPlan) -> list[str]:
    """The command that runs Python inside the image for the probe (its source on stdin), with the
    flags a run gets that change what the probe sees: host network and IPC, the GPUs and IB devices
    where the host has them (the probe adds those), the user's mounts."""
    if container.runtime == "apptainer":
        return ["apptainer", "exec", *_user_mounts(container, shell=False), *container.options]
    return [container.runtime, "run", "--rm", "-i", "--network", "host", "--ipc", "host", "--pull=never",
            *_user_mounts(container, shell=False), *container.options]
