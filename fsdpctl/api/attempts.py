"""The next attempt of a run: by hand (``Run.resume``, ``launch --resume``) or after a failure
(``max_restarts``), planned from what the run was made from, refused in one line when it cannot
continue."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from ..errors import UsageError
from ..rundir.state import RunState

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..bundle import Payload
    from ..hostpool.choice import HostChoice
    from ..plan.types import LaunchPlan
    from ..profiles.schema import ClusterProfile
    from ..rundir.rundir import RunDir
    from ..rundir.state import Outcome
    from .events import Emitter


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


def profile_now(run: RunDir, emit: Optional[Emitter] = None, inputs: Optional[dict[str, Any]] = None
                ) -> ClusterProfile:
    """The run's profile (its copy, as it started) with the spares its profile file names now: a spare
    added (or taken out) while the run goes counts for its next attempt. The file is read again each
    time; when it is gone, no longer valid, or now another profile's, the run keeps the spares it
    has, and ``emit`` is told why. ``emit`` also hears which spares changed. ``inputs``: the run's
    inputs.json, when already read."""
    from pathlib import Path

    from ..errors import FsdpctlError
    from ..profiles.loader import load_profile_file
    from ..rundir.paths import read_json
    from ..rundir.rundir import INPUTS

    profile = run.profile
    inputs = inputs if inputs is not None else read_json(run.root / INPUTS) or {}
    source = str(inputs.get("profile_source") or "")
    if not source or not Path(source).is_file():  # a profile given as an object, or an embedded one
        return profile
    try:
        current = load_profile_file(Path(source)).profile
    except FsdpctlError as exc:
        if emit is not None:
            emit.notice(f"{source} no longer reads ({exc.message}): run {run.run_id} keeps the spares it "
                        f"started with", "warning")
        return profile
    if current.name != profile.name or current.backend != profile.backend:
        return profile
    running = {h.host for h in profile.hosts}
    spares = tuple(s for s in current.spares if s.host not in running)
    if [s.host for s in spares] == [s.host for s in profile.spares]:
        return profile
    if emit is not None:
        before, now = {s.host for s in profile.spares}, {s.host for s in spares}
        changes = [f"{h} added" for h in sorted(now - before)] + [f"{h} taken out" for h in sorted(before - now)]
        emit.notice(f"profile {profile.name}: spares now {', '.join(s.host for s in spares) or 'none'} "
                    f"({', '.join(changes) or 'reordered'}; read from {source})", "info")
    return dataclasses.replace(profile, spares=spares)


def hosts_placed_now(run: RunDir, inputs: Optional[dict[str, Any]] = None) -> HostChoice:
    """The run's hosts as a launch of its profile would place them now: remembered exclusions and its
    ``--exclude`` applied, short of hosts down to an elastic run's ``min_nodes`` (UsageError below it).
    ``inputs``: the run's inputs.json, when already read."""
    from ..hostpool.placing import place_hosts
    from ..plan.elastic_policy import min_nodes_in
    from ..rundir.paths import read_json
    from ..rundir.rundir import INPUTS

    inputs = inputs if inputs is not None else read_json(run.root / INPUTS) or {}
    return place_hosts(profile_now(run, inputs=inputs), tuple(inputs.get("exclude") or ()),
                       min_nodes_in(run.plan.elastic))


def plan_next_attempt(backend: Backend, run: RunDir, *, train: dict[str, Any],
                      profile: Optional[ClusterProfile] = None, **changes: Any) -> tuple[LaunchPlan, dict[str, str]]:
    """The plan and scripts of the run's next attempt through its backend: the inputs it was made
    from, with ``train`` settings (``--steps``/``--epochs``) and ``changes`` (other Overrides fields)
    over them. ``profile``: the profile to place it with (default: the run's own, as it was);
    another may name other hosts, and the attempt then runs on those (run.json records its nodes)."""
    from ..plan.elastic_policy import next_size
    from ..plan.make import make_plan
    from ..plan.types import overrides_from_json
    from ..rundir.paths import read_json
    from ..rundir.rundir import INPUTS

    inputs = read_json(run.root / INPUTS)
    if not inputs:
        raise UsageError(f"run {run.run_id}: has no {INPUTS} (started by an older fsdpctl)",
                         "start it afresh with `fsdpctl launch`")
    if profile is None and backend.takes_spares:
        choice = hosts_placed_now(run, inputs)
        profile, changes["full_nodes"] = choice.profile, changes.get("full_nodes") or choice.full
    nodes = len(profile.hosts) if profile is not None and backend.takes_spares else run.plan.num_nodes
    changes.update(next_size(run.plan.elastic, nodes_before=run.plan.num_nodes, nodes=nodes,
                             full_nodes=changes.get("full_nodes")))
    overrides = overrides_from_json(inputs["overrides"])
    overrides = dataclasses.replace(overrides, train={**overrides.train, **train}, attempt=run.plan.attempt + 1,
                                    **{k: v for k, v in changes.items()
                                       if v is not None or k in ("full_nodes", "batch_limit")})
    plan = make_plan(profile or run.profile, placer=type(backend), run_id=run.run_id, local_run_dir=str(run.root),
                     profile_source=inputs["profile_source"], overrides=overrides,
                     local_python=inputs["local_python"], home=inputs["home"], local_cwd=inputs["local_cwd"])
    if plan.run_dir != run.plan.run_dir:  # every attempt continues in the run's own directory
        raise UsageError(f"run {run.run_id}: attempt {plan.attempt} would run in {plan.run_dir}, not in the "
                         f"run's directory {run.plan.run_dir}", "keep the profile's workdir as it was")
    return plan, backend.scripts(plan)


def checkpoint_steps(backend: Backend, run: RunDir) -> list[int]:
    """The steps of the bundled workload's complete checkpoints in the run directory on the nodes,
    oldest first (HostError when no node answers)."""
    from ..workload.layout import complete_steps_command, parse_steps

    return parse_steps(backend.ask(run, complete_steps_command(".")))


def plan_resume(backend: Backend, run: RunDir, *, steps: Optional[int] = None, epochs: Optional[int] = None,
                **changes: Any) -> NextAttempt:
    """The run's next attempt, or a one-line refusal: a live run, a bundled run without a complete
    checkpoint or with nothing left to train. ``changes``: other Overrides fields (the watchdog's
    and restarts' settings) for this attempt."""
    from ..rundir.attempts import check_resumable
    from .options import workload_settings

    train: dict[str, Any] = {}
    if steps is not None or epochs is not None:
        if run.plan.command:
            raise UsageError("--steps/--epochs: settings of the bundled workload, and this run is your own program",
                             "pass your program's settings through its own arguments (a new run)")
        given = {name: value for name, value in (("steps", steps), ("epochs", epochs)) if value is not None}
        train = workload_settings(given)
    if changes.get("max_restarts") and backend.queued:
        raise UsageError(f"--max-restarts: {backend.name} requeues a job itself", "submit it with --requeue instead")
    state = backend.status(run).state
    steps_saved = [] if run.plan.command else checkpoint_steps(backend, run)
    from_step = check_resumable(run, state, steps_saved, train.get("steps"))
    plan, scripts = plan_next_attempt(backend, run, train=train, **changes)
    return NextAttempt(plan, scripts, from_step)


def plan_restart(backend: Backend, run: RunDir, outcome: Outcome, last_attempt: int
                 ) -> tuple[Optional[NextAttempt], Optional[str]]:
    """After a failed attempt: the next attempt and what ended this one, or (None, why not; None
    when there is nothing to say) when the run ends here. ``last_attempt``: the highest attempt this
    launch may start (its first one plus its restarts). With restarts allowed, run.json keeps the
    verdict as the attempt's ``restart`` (``restart_causes``: a restart follows the failure's cause)."""
    plan = run.plan
    if outcome.state in (RunState.INTERRUPTED, RunState.STOPPED) or run.record.stopped_at:
        return None, None  # Ctrl-C, a stop signal or `fsdpctl stop`: the user ended it
    if not plan.max_restarts and plan.attempt >= last_attempt:
        return None, None
    from .restart_causes import hardware_faults, judge_run

    verdict = judge_run(run, outcome.first_failure, hardware_faults(run))
    attempt, why = _restart_after(backend, run, outcome, last_attempt) if verdict.restart else (None, verdict.why)
    if attempt is None:
        verdict = dataclasses.replace(verdict, restart=False, why=why or verdict.why)
    run.change(restart=verdict.to_json())
    return attempt, why


def _restart_after(backend: Backend, run: RunDir, outcome: Outcome, last_attempt: int
                   ) -> tuple[Optional[NextAttempt], Optional[str]]:
    plan = run.plan
    if plan.attempt >= last_attempt:
        return None, f"not restarted: no restart left (--max-restarts {plan.max_restarts})"
    from_step = None
    if not plan.command:
        try:
            saved = checkpoint_steps(backend, run)
        except Exception as exc:  # noqa: BLE001 - any failure to look means: do not restart blind
            return None, f"not restarted: could not look for a checkpoint ({exc})"
        if not saved:
            return None, "not restarted: the run has no complete checkpoint yet (it would start from step 0)"
        from_step = saved[-1]
    try:
        next_plan, scripts = plan_next_attempt(backend, run, train={})
    except UsageError as exc:
        return None, f"not restarted: {exc.message}"
    after = outcome.first_failure.describe() if outcome.first_failure else f"exit {outcome.exit_code}"
    return NextAttempt(next_plan, scripts, from_step), after
