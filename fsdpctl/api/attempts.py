"""The next attempt of a run: by hand (``Run.resume``, ``launch --resume``) or after a failure
(``max_restarts``), planned from what the run was made from, refused in one line when it cannot
continue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ..errors import UsageError
from ..rundir.state import RunState

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..bundle import Payload
    from ..plan.types import LaunchPlan
    from ..rundir.rundir import RunDir
    from ..rundir.state import Outcome


@dataclass(frozen=True)
class NextAttempt:
    """A planned attempt of an existing run."""

    plan: LaunchPlan
    scripts: dict[str, str]
    from_step: Optional[int]
    """The checkpoint step the bundled workload continues from (None: a program of the user's)."""

    def payload(self) -> Payload:
        """The node scripts (the code and the workload package are in the run directory already) and
        the secrets, read again from this environment."""
        from ..bundle import Payload, node_payload
        from ..job import secret_values

        return Payload(node_payload(self.scripts, None), secret_values(self.plan.secrets))


def plan_resume(backend: Backend, run: RunDir, *, for_slurm: bool, steps: Optional[int] = None,
                epochs: Optional[int] = None, **changes: Any) -> NextAttempt:
    """The run's next attempt, or a one-line refusal: another backend's run, a live run, a bundled run
    without a complete checkpoint or with nothing left to train. ``changes``: other Overrides fields
    (the watchdog's and restarts' settings) for this attempt."""
    from ..rundir.attempts import check_resumable, plan_next_attempt
    from .options import workload_settings

    rid = run.run_id
    if (run.backend_name == "slurm") != for_slurm:
        how = f"fsdpctl {'submit --slurm' if run.backend_name == 'slurm' else 'launch'} --resume {rid}"
        raise UsageError(f"run {rid}: ran through {run.backend_name}", f"continue it with `{how}`")
    train: dict[str, Any] = {}
    if steps is not None or epochs is not None:
        if run.plan.command:
            raise UsageError("--steps/--epochs: settings of the bundled workload, and this run is your own program",
                             "pass your program's settings through its own arguments (a new run)")
        given = {name: value for name, value in (("steps", steps), ("epochs", epochs)) if value is not None}
        train = workload_settings(given)
    state = backend.status(run).state
    steps_saved = [] if run.plan.command else backend.checkpoint_steps(run)
    from_step = check_resumable(run, state, steps_saved, train.get("steps"))
    plan, scripts = plan_next_attempt(run, train=train, **changes)
    return NextAttempt(plan, scripts, from_step)


def plan_restart(backend: Backend, run: RunDir, outcome: Outcome, last_attempt: int
                 ) -> tuple[Optional[NextAttempt], Optional[str]]:
    """After a failed attempt: the next attempt and what ended this one, or (None, why not; None
    when there is nothing to say) when the run ends here. ``last_attempt``: the highest attempt this
    launch may start (its first one plus its restarts)."""
    from ..rundir.attempts import plan_next_attempt

    plan = run.plan
    if outcome.state in (RunState.INTERRUPTED, RunState.STOPPED) or run.record.stopped_at:
        return None, None  # Ctrl-C, a stop signal or `fsdpctl stop`: the user ended it
    if plan.attempt >= last_attempt:
        return None, (f"no restart left (--max-restarts {plan.max_restarts})" if plan.max_restarts else None)
    from_step = None
    if not plan.command:
        try:
            saved = backend.checkpoint_steps(run)
        except Exception as exc:  # noqa: BLE001 - any failure to look means: do not restart blind
            return None, f"not restarting: could not look for a checkpoint ({exc})"
        if not saved:
            return None, "not restarting: the run has no complete checkpoint yet (it would start from step 0)"
        from_step = saved[-1]
    next_plan, scripts = plan_next_attempt(run, train={})
    after = outcome.first_failure.describe() if outcome.first_failure else f"exit {outcome.exit_code}"
    return NextAttempt(next_plan, scripts, from_step), after
