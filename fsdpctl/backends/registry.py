"""The backend registry: a name (a profile's ``backend``, a run's) to the class that runs jobs that way.

Built in: ``local`` (this machine), ``ssh`` (hosts over SSH), ``slurm`` (nodes Slurm allocates). A
third-party backend is one package with a ``Backend`` subclass, registered under the entry point
group ``fsdpctl.backends`` (torchx's schedulers and submitit's executors are found the same way)::

    [project.entry-points."fsdpctl.backends"]
    k8s = "fsdpctl_k8s:K8sBackend"

Every backend, built-in ones included, is named by a ``module:Class`` string and imported only when
asked for: naming the backends loads none of them (so the profile loader can check a name), and a
command never pays for paramiko or submitit it does not use.
"""

from __future__ import annotations

import functools
import importlib
from importlib import metadata
from typing import Any

from ..errors import UsageError

ENTRY_POINT_GROUP = "fsdpctl.backends"
BUILT_IN = {
    "local": "fsdpctl.backends.local:LocalBackend",
    "ssh": "fsdpctl.backends.ssh:SSHBackend",
    "slurm": "fsdpctl.backends.slurm:SlurmBackend",
}
"""name -> ``module:Class``; an entry point of the same name cannot replace one of these."""
_INTERFACE = "fsdpctl.backends.base:Backend"


@functools.lru_cache(maxsize=1)
def _registered() -> dict[str, str]:
    found = dict(BUILT_IN)
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry.value)
    return found


def backend_names() -> list[str]:
    """Every backend fsdpctl can run jobs with: the built-in ones and those installed packages register."""
    return sorted(_registered())


def refresh() -> None:
    """Read the installed packages' entry points again (after installing a backend in this process)."""
    _registered.cache_clear()
    backend_class.cache_clear()


def _load(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


@functools.cache
def backend_class(name: str) -> Any:
    """The ``Backend`` subclass registered as ``name``; UsageError when no backend has that name or
    it cannot be loaded."""
    target = _registered().get(name)
    if target is None:
        raise UsageError(f"backend {name!r}: not a backend fsdpctl knows",
                         f"give one of {', '.join(backend_names())}, or install the package that provides it "
                         f"(it registers under the entry point group {ENTRY_POINT_GROUP})")
    try:
        cls = _load(target)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"backend {name!r}: {target} cannot be loaded ({type(exc).__name__}: {exc})",
                         "reinstall the package that provides it") from None
    if not (isinstance(cls, type) and issubclass(cls, _load(_INTERFACE))):
        raise UsageError(f"backend {name!r}: {target} is not a subclass of {_INTERFACE.replace(':', '.')}",
                         "its package must register a Backend subclass")
    return cls
