"""``launch --resume`` / ``submit --slurm --resume``, and ``--max-restarts``: the next attempt of a run,
planned from what the run was made from, refused with one line when it cannot continue."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import typer

from ..errors import UsageError

if TYPE_CHECKING:
    from ..backends.base import Backend, Outcome
    from ..bundle import Payload
    from ..job import JobFlags
    from ..plan.types import LaunchPlan
    from ..runs.record import Run


ResumeOpt = typer.Option(None, "--resume", metavar="RUN_ID", help="Start the next attempt of RUN_ID in its own run "
                         "directory with its own plan (the bundled workload from its newest complete checkpoint); "
                         "only --steps/--epochs may change.")
_FLAG_NAMES = {"command": "-- COMMAND", "code_limit_mb": "--code-limit", "requirements_file": "--requirements",
               "settings": "--set"}


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


def refuse_flags_with_resume(flags: JobFlags, workload: dict[str, Any], **others: Any) -> None:
    """Flags that would change the plan of the run being resumed (it keeps its own): the job's, the
    workload's but --steps/--epochs, and the command's ``others``."""
    given = {**dataclasses.asdict(flags), **{k: v for k, v in workload.items() if k not in ("steps", "epochs")},
             **others}
    for name, value in given.items():
        if value not in (None, False, [], ()):
            flag = _FLAG_NAMES.get(name) or "--" + name.replace("_", "-")
            raise UsageError(f"{flag}: --resume continues the run with its own plan (profile, settings, command)",
                             "drop it (only --steps and --epochs may change), or start a new run without --resume")


def plan_resume(backend: Backend, run: Run, *, for_slurm: bool, steps: Optional[int] = None,
                epochs: Optional[int] = None, **changes: Any) -> NextAttempt:
    """The run's next attempt, or a one-line refusal: another backend's run, a live run, a bundled run
    without a complete checkpoint or with nothing left to train."""
    from ..runs.attempts import check_resumable, plan_next_attempt
    from .common import train_overrides

    rid = run.run_id
    if (run.backend_name == "slurm") != for_slurm:
        how = f"fsdpctl {'submit --slurm' if run.backend_name == 'slurm' else 'launch'} --resume {rid}"
        raise UsageError(f"run {rid}: ran through {run.backend_name}", f"continue it with `{how}`")
    train = {}
    if steps is not None or epochs is not None:
        if run.plan.command:
            raise UsageError("--steps/--epochs: settings of the bundled workload, and this run is your own program",
                             "pass your program's settings through its own arguments (a new run)")
        train = train_overrides(steps=steps, epochs=epochs)
    state = backend.status(run).get("state") or "unknown"
    steps_saved = [] if run.plan.command else backend.checkpoint_steps(run)
    from_step = check_resumable(run, state, steps_saved, train.get("steps"))
    plan, scripts = plan_next_attempt(run, train=train, **changes)
    return NextAttempt(plan, scripts, from_step)


def plan_restart(backend: Backend, run: Run, outcome: Outcome, last_attempt: int
                 ) -> tuple[Optional[NextAttempt], Optional[str]]:
    """After a failed attempt: the next attempt and the line that announces it, or (None, why not;
    None when there is nothing to say) when the run ends here. ``last_attempt``: the highest attempt
    this launch may start (its first one plus its restarts)."""
    from ..runs.attempts import describe_failure, plan_next_attempt

    plan = run.plan
    if outcome.state == "interrupted" or run.record.get("stopped_at"):
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
    after = describe_failure(outcome.first_failure) if outcome.first_failure else f"exit {outcome.exit_code}"
    where = f" from step {from_step}" if from_step is not None else ""
    line = f"attempt {next_plan.attempt} of {last_attempt}{where} after {after}"
    return NextAttempt(next_plan, scripts, from_step), line


def echo(line: str, colour: Optional[str] = None) -> None:
    typer.secho(f"fsdpctl: {line}", err=True, fg=colour)
