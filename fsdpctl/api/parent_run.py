"""A run's MLflow parent run (``export.mlflow``), as the launcher keeps it: made before anything of
the run starts, its id in every rank's ``FSDPCTL_MLFLOW_PARENT_RUN_ID`` (kept with the run's inputs,
so every later attempt and restart nests under the same one), set running again by a later attempt,
and given the run's end by the process that owns (or collects) the run. Once the run exists the
tracking server can only cost a notice: it never fails the run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..plan.export import PARENT_RUN_ENV
from ..rundir.state import RunState

if TYPE_CHECKING:
    from ..export.mlflow_parent import Status
    from ..plan.types import LaunchPlan
    from .events import Emitter
    from .prepare import Prepared

_ENDS: dict[RunState, Status] = {
    RunState.SUCCEEDED: "FINISHED",
    RunState.STOPPED: "KILLED",
    RunState.INTERRUPTED: "KILLED",
    RunState.CANCELLED: "KILLED",
}
"""MLflow's word for how a run ended; every other end but UNKNOWN is FAILED."""


def with_parent_run(prepared: Prepared, emit: Emitter) -> Prepared:
    """``prepared`` with its MLflow parent run made (or found) and its id for every rank; as it is
    without ``export.mlflow``. UsageError when mlflow is missing here, FsdpctlError when the tracking
    server refuses: nothing has started yet, so the launch stops there."""
    spec = prepared.plan.export.get("mlflow")
    if not spec:
        return prepared
    from ..export.mlflow_parent import parent_run

    plan = prepared.plan
    parent = parent_run(tracking_uri=spec["tracking_uri"], experiment=spec["experiment"], run_id=plan.run_id,
                        profile=plan.profile_name, backend=plan.backend)
    emit.notice(f"mlflow: parent run {parent} in experiment {spec['experiment']!r} ({spec['tracking_uri']})")
    return prepared.with_env({PARENT_RUN_ENV: parent})


def parent_of(plan: LaunchPlan) -> Optional[tuple[str, str]]:
    """(tracking URI, parent run id) of a plan made with ``export.mlflow``; None otherwise."""
    spec = plan.export.get("mlflow")
    parent = plan.env.get(PARENT_RUN_ENV)
    return (spec["tracking_uri"], str(parent)) if spec and parent else None


def end_status(state: RunState) -> Optional[Status]:
    """The parent run's status for a run that ended in ``state`` (None: UNKNOWN, nobody can tell)."""
    if state is RunState.UNKNOWN or not state.is_over:
        return None
    return _ENDS.get(state, "FAILED")


def mark_parent(plan: LaunchPlan, status: Optional[Status], emit: Emitter) -> None:
    """Set the plan's parent run ``status``, best effort: a tracking server that refuses or does not
    answer is a warning notice, never a failure. Nothing without a parent run or a status."""
    where = parent_of(plan)
    if where is None or status is None:
        return
    from ..errors import FsdpctlError
    from ..export.mlflow_parent import set_status

    try:
        set_status(*where, status)
    except FsdpctlError as exc:
        emit.notice(f"warning: {exc.message} (the run is not affected)", "warning")
