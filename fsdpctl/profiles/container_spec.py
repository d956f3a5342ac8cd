"""What a profile's ``container`` section may say: the image every node's ranks run in."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

ContainerRuntime = Literal["docker", "podman", "apptainer", "pyxis"]
PullPolicy = Literal["missing", "always", "never"]
CONTAINER_NAME_PATTERN = re.compile(r"^[A-Za-z0-9~/.][A-Za-z0-9_.:/@+#~-]*$")  # enroot writes registry#image


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """Run every node's ranks inside a container image (``--container IMAGE`` gives or overrides the
    image). One container per node runs torchrun with the host's network and IPC namespace, the GPUs,
    the InfiniBand devices when ``network.ib`` is on, and the run directory at its own path; doctor
    and the preflight probe inside the image too (``python:`` is then the Python inside it)."""

    image: str
    """The image: a registry reference (``nvcr.io/nvidia/pytorch:25.01-py3``), a local name, or for
    apptainer a ``.sif`` path (or ``docker://...``); pyxis takes enroot's ``registry#image`` form too."""
    runtime: ContainerRuntime = "docker"
    """docker, podman, apptainer (also Singularity's successor on Slurm nodes), or pyxis (Slurm's
    ``srun --container-image``; ``backend: slurm`` only)."""
    mounts: tuple[str, ...] = ()
    """More host folders inside: ``/data:/data`` or ``/data:/data:ro`` (the run directory, and the
    folder the ranks start in, are always mounted at their own paths)."""
    options: tuple[str, ...] = ()
    """Extra flags for the runtime's run command, one word each (``--shm-size=16g``, ``--cap-add=IPC_LOCK``)."""
    pull: PullPolicy = "missing"
    """missing: pull where a node lacks the image; always: pull before every launch and doctor (the
    digest check then compares what was pulled); never: a node without the image fails the check."""
    workdir: Optional[str] = None
    """Where the ranks start inside (an absolute path); default: where they start without a container."""
    host_python: str = "python3"
    """The Python on the hosts themselves, which runs fsdpctl's node agent, probe and GPU sampler
    outside the container (standard library only, 3.8+)."""
    @staticmethod
    def image_ok(image: str) -> bool:
        """Whether ``image`` can name an image (and is safe in a command line)."""
        return bool(CONTAINER_NAME_PATTERN.match(image))

    memlock: bool = True
    """Ask for an unlimited locked-memory limit inside (RDMA needs it) where the host's own hard limit
    is unlimited; a host whose limit is lower starts the container without it."""
