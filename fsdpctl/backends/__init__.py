"""Where a job runs: the backend that a profile or a run names becomes one here (through the
registry, ``registry``) and nowhere else; everything after that only calls the ``base.Backend``
interface."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .registry import ENTRY_POINT_GROUP, backend_class, backend_names, refresh

if TYPE_CHECKING:
    from ..plan.types import LaunchPlan
    from ..profiles.schema import ClusterProfile
    from ..rundir.rundir import RunDir
    from .base import Backend

__all__ = ["ENTRY_POINT_GROUP", "backend_class", "backend_for", "backend_for_run", "backend_names", "plan_run",
           "refresh", "render_scripts"]


def backend_for(profile: ClusterProfile, name: Optional[str] = None) -> Backend:
    """The backend that runs ``profile``'s jobs: ``name`` when given (a plan's or a run's, e.g.
    ``slurm`` for ``submit --slurm``), else the profile's own ``backend``."""
    return backend_class(name or profile.backend)(profile)


def backend_for_run(run: RunDir) -> Backend:
    """The backend a run was started with, as its run.json names it."""
    return backend_for(run.profile, run.backend_name)


def plan_run(profile: ClusterProfile, *, backend: Optional[str] = None, **inputs: Any) -> LaunchPlan:
    """The plan of a run of ``profile`` through ``backend`` (default: the profile's); ``inputs`` are
    ``make_plan``'s (run_id, local_run_dir, overrides...)."""
    from ..plan.make import make_plan

    return make_plan(profile, placer=backend_class(backend or profile.backend), **inputs)


def render_scripts(plan: LaunchPlan) -> dict[str, str]:
    """Every script of ``plan``, as the backend it goes through renders them."""
    return backend_class(plan.backend).scripts(plan)
