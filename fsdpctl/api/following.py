"""Starting and following a run, whatever runs it: the preflight, the start, following it to its end
with the hang watchdog, and starting it again after a failure while its restarts last. Everything
the user should hear goes out as events; nothing here prints."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

from ..errors import PreflightError
from ..rundir.state import Outcome
from .events import (
    AttemptStarting,
    Emitter,
    Fetched,
    HostChecked,
    PreflightFailed,
    PreflightStarted,
    RunEnded,
    RunStarted,
)

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..bundle import Payload
    from ..plan.types import LaunchPlan
    from ..rundir.rundir import RunDir


def passes_preflight(backend: Backend, plan: LaunchPlan, payload: Payload, emit: Emitter, *,
                     recheck: bool = False) -> bool:
    """doctor's fast checks on the plan's nodes (the agents stage the payload on the way). A first
    preflight that fails raises PreflightError; a re-check says so with an event and returns False."""
    emit(PreflightStarted(plan.num_nodes, recheck))
    report = backend.preflight(plan, payload, on_host=lambda host: emit(HostChecked(host)))
    if report is None or report.ok:
        return True
    if not recheck:
        raise PreflightError(report)
    emit(PreflightFailed(report))
    return False


def start(backend: Backend, run: RunDir, payload: Payload, emit: Emitter, *, detached: bool) -> None:
    """Start (or submit) the run's current attempt."""
    how = backend.start(run, payload, detached=detached)
    emit(RunStarted(run.run_id, how, str(run.root), run.plan.attempt, detached))


def follow(backend: Backend, run: RunDir, emit: Emitter, *, owner: bool, signals: bool,
           leave: Optional[threading.Event] = None) -> Outcome:
    """Follow the run to its end (or until ``leave`` is set, for a follower that is not its owner),
    its lines and the hang watchdog's reports as events; then the flight recorder's dumps of a
    failed run, read. A KeyboardInterrupt (without ``signals``) is raised again once the run it
    owns is stopped and recorded."""
    from ..diagnose.hang import flight_after_failure, watch_for

    # A follower of someone else's foreground run only reports a hang; its launcher acts on it. A
    # detached or queued run has no such owner: whoever follows it acts.
    act = owner or run.record.detached or backend.queued
    watch = watch_for(backend, run, act=act, echo=emit.notice)
    outcome = backend.follow(run, emit, owner=owner, watch=watch, signals=signals, leave=leave)
    emit(RunEnded(run.run_id, outcome, str(run.root)))
    failure = outcome.first_failure
    if act and outcome.state.is_failure and (failure is None or failure.kind == "exit"):
        flight_after_failure(backend, run, echo=emit.notice)
    if outcome.interrupted_by is not None and not signals:
        raise KeyboardInterrupt
    return outcome


def follow_with_restarts(backend: Backend, run: RunDir, emit: Emitter, *, signals: bool,
                         fetch: tuple[str, ...] = ()) -> tuple[RunDir, Outcome]:
    """Follow a foreground run this process started to its end; after a failure, re-check the nodes
    and start the next attempt while the run's restarts last; then fetch. The run as it now is (its
    last attempt) and how it ended."""
    from ..rundir.attempts import begin_attempt
    from .attempts import plan_restart

    plan = run.plan
    last_attempt = plan.attempt + plan.max_restarts
    outcome = follow(backend, run, emit, owner=True, signals=signals)
    while outcome.exit_code != 0:
        attempt, after = plan_restart(backend, run, outcome, last_attempt)
        if attempt is None:
            if after:
                emit.notice(after, "warning")
            break
        emit(AttemptStarting(plan.run_id, attempt.plan.attempt, last_attempt, attempt.from_step, after or ""))
        payload = attempt.payload()
        if not passes_preflight(backend, attempt.plan, payload, emit, recheck=True):
            emit.notice(f"run {plan.run_id} ends: a node failed its re-check before attempt {attempt.plan.attempt} "
                        f"(above); nothing of it was started", "error")
            break
        run = begin_attempt(run, attempt.plan, attempt.scripts, attempt.from_step)
        start(backend, run, payload, emit, detached=False)
        outcome = follow(backend, run, emit, owner=True, signals=signals)
    for path in fetch:
        emit(Fetched(backend.fetch(run, path)))
    return run, outcome
