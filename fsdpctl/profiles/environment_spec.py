"""A profile's (or a job's) ``environment`` section: the Python environment fsdpctl makes on every node
from your lock, and runs the ranks in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

EnvInstall = Literal["auto", "sent", "node"]


@dataclass(frozen=True, kw_only=True)
class EnvironmentSpec:
    """The packages every rank imports, made into a virtual environment on each node by uv before the ranks
    start, kept in a cache on the node keyed by their exact versions and the node's platform, and reused
    while nothing changes. The ranks run in it: the profile's ``python`` is only the interpreter it is
    made from. Not with ``container`` (an image holds its own environment)."""

    file: Optional[str] = None
    """A ``uv.lock`` (its ``pyproject.toml`` beside it), a ``pyproject.toml``, or a ``requirements.txt``;
    relative to the profile's or job's file (``--env-from`` on the command line: to the current folder)."""
    packages: tuple[str, ...] = ()
    """Requirement lines (``numpy==2.1.3``, ``torch==2.13.0``), beside ``file`` or instead of it."""
    index_url: Optional[str] = None
    """The package index the launcher resolves from (default: uv's, PyPI)."""
    extra_index_urls: tuple[str, ...] = ()
    """More indexes to resolve from."""
    find_links: tuple[str, ...] = ()
    """Folders (on the launching machine) or pages of wheels to resolve from, e.g. wheels you built."""
    torch_backend: str = "auto"
    """Which build of torch: ``auto`` picks each node's from the CUDA its driver supports (``cu128``...)
    and ``cpu`` on a node without a GPU (both from PyTorch's index); ``none`` takes what the indexes
    above give; or name one (``cu126``, ``cpu``)."""
    install: EnvInstall = "auto"
    """How a node gets the wheels: ``sent`` (the launcher sends each one over SSH, once per node),
    ``node`` (the node downloads them itself), or ``auto`` (the node downloads when it reaches the
    index, else they are sent). Wheels from a local folder are always sent."""
    root: Optional[str] = None
    """Where a node keeps its environments and wheels (default: ``<workdir>/envs``). Put it on the
    node's own disk where home directories are on a network file system."""
    keep: int = 3
    """Environments a node keeps (the most recently used); older ones, and wheels nothing needs any
    more, are removed after a new one is made. One in use by a running process is never removed."""
