"""Where a job runs: this machine (``local``), SSH hosts (``ssh``) or a Slurm cluster (``slurm``).

Each backend implements ``base.Backend``. Which one a profile or a run uses is decided here and
nowhere else: a command asks ``backend_for`` (a profile, before a run) or ``backend_for_run`` (a run
directory, named once in its run.json) and then only calls the interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from ..profiles.schema import ClusterProfile
    from ..rundir.rundir import RunDir
    from .base import Backend


def backend_for(profile: ClusterProfile, name: Optional[str] = None) -> Backend:
    """The backend that runs ``profile``'s jobs: ``name`` when given (a plan's or a run's, e.g. ``slurm``
    for ``submit --slurm``), else the profile's own ``backend``. Modules load on demand, so a command
    never pays for paramiko or submitit it does not use."""
    chosen = name or profile.backend
    if chosen == "local":
        from .local import LocalBackend

        return LocalBackend(profile)
    if chosen == "ssh":
        from .ssh import SSHBackend

        return SSHBackend(profile)
    if chosen == "slurm":
        from .slurm.backend import SlurmBackend

        return SlurmBackend(profile)
    raise ValueError(f"unknown backend {chosen!r}")


def backend_for_run(run: RunDir) -> Backend:
    """The backend a run was started with, as its run.json names it."""
    return backend_for(run.profile, run.backend_name)
