"""Starting and following a run, whatever runs it: the preflight, the start, following it to its end
with the hang watchdog (``restarting`` starts it again after a failure). A new run, a resumed one and
a restart all go through ``start_attempt``. Everything the user should hear goes out as events;
nothing here prints."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Optional

from ..errors import PreflightError
from ..rundir.state import Outcome
from .events import (
    Emitter,
    HangSuspected,
    HostChecked,
    PreflightFailed,
    PreflightStarted,
    RunEnded,
    RunStarted,
)
from .parent_run import end_status, mark_parent

if TYPE_CHECKING:
    from ..backends.base import Backend, Follower, Preflight
    from ..backends.hang_watch import HangVerdict, HangWatch
    from ..bundle import Payload
    from ..plan.types import LaunchPlan
    from ..rundir.rundir import RunDir


def check(backend: Backend, plan: LaunchPlan, payload: Payload, emit: Emitter, *,
          recheck: bool = False) -> Preflight:
    """doctor's fast checks on the plan's nodes (the agents stage the payload on the way). A first
    preflight that fails raises PreflightError; a re-check that fails says so with an event and is
    returned (``ok`` false, nothing left staged)."""
    if plan.environment is not None:  # first: the preflight judges the ranks' own Python
        make_environment(backend, plan, emit)
    emit(PreflightStarted(plan.num_nodes, recheck))
    found = backend.preflight(plan, payload, on_host=lambda host: emit(HostChecked(host)))
    if found.report is not None:
        from .doctor import remember

        remember(plan.profile_name, found.report, f"the preflight of run {plan.run_id}")
    if found.ok:
        return found
    if found.staged is not None and hasattr(found.staged, "close"):
        found.staged.close()  # the staged agents clean up what they unpacked
    if not recheck:
        raise PreflightError(found.report)
    emit(PreflightFailed(found.report))
    return found


def make_environment(backend: Backend, plan: LaunchPlan, emit: Emitter) -> None:
    """The plan's environment on every node before anything else runs there, each node's part said."""
    from ..rundir.timeline import timeline_for
    from .events import EnvironmentProgress

    assert plan.environment is not None
    line = timeline_for(plan.run_id, plan.attempt)
    with line.span("environment"):
        made = backend.make_environment(plan, on_bytes=lambda sent, total: emit(EnvironmentProgress(sent, total)),
                                        on_node=lambda node: emit.notice(f"{node.host}: {node.describe()}"))
    removed = sum(len(node.removed) for node in made)
    if removed:
        emit.notice(f"environment: {removed} older environment(s) removed from the nodes "
                    f"(keep: {plan.environment.keep})")


def start_attempt(backend: Backend, plan: LaunchPlan, payload: Payload, emit: Emitter, *,
                  open_run: Callable[[], RunDir], detached: bool, preflight: bool = True,
                  recheck: bool = False, checked: Optional[Preflight] = None,
                  spawn: bool = True) -> Optional[tuple[RunDir, Follower]]:
    """Check the nodes (unless ``preflight`` is off, or ``checked`` is what a check of this plan
    found), make the run directory ready (``open_run``: a new run's, or the next attempt's), start
    the attempt and say so; the run and its owner's follower (a detached attempt gets a follower
    process of its own, ``background``, unless ``spawn`` is off: that process starts it). None when
    a re-check failed: nothing was started."""
    if checked is None and preflight:
        checked = check(backend, plan, payload, emit, recheck=recheck)
    elif checked is None and plan.environment is not None:
        make_environment(backend, plan, emit)
    if checked is not None and not checked.ok:
        return None
    try:
        run = open_run()
    except BaseException:
        if checked is not None and hasattr(checked.staged, "close"):
            checked.staged.close()  # staged agents that hear no "go" remove what they unpacked
        raise
    follower = backend.start(run, payload, detached=detached, preflight=checked)
    from ..rundir.timeline import forget

    timed = forget(run.plan.run_id, run.plan.attempt)
    if timed is not None:  # the launcher's part; whoever collects the run adds what the nodes' lines show
        run.add_timeline(timed, run.plan.attempt)
    if detached and spawn:  # nobody here follows it: a process of its own collects it and records its end
        from .detached import spawn_follower

        spawn_follower(run)
    emit(RunStarted(run.run_id, follower.how, str(run.root), run.plan.attempt, detached, run.plan.world_size))
    if run.plan.attempt > 1:  # the run goes on: its MLflow parent run, ended with the attempt before, runs again
        mark_parent(run.plan, "RUNNING", emit)
    return run, follower


def follow(backend: Backend, run: RunDir, follower: Follower, emit: Emitter, *, signals: bool,
           act: bool, leave: Optional[threading.Event] = None,
           wrap_watch: Optional[Callable[[Optional[HangWatch]], HangWatch]] = None) -> Outcome:
    """Follow the run to its end (or until ``leave`` is set, for a follower that is not its owner),
    its lines and the hang watchdog's reports as events; then the flight recorder's dumps of a
    failed run, read. ``act``: this follower may end the run on a hang (its owner, or anyone
    following a run nobody owns). A KeyboardInterrupt (without ``signals``) is raised again once
    the run it owns is stopped and recorded. ``wrap_watch``: the watch the follower asks instead
    of the hang watchdog, given it (an elastic run's growth beside it)."""
    from ..diagnose.hang import flight_after_failure, watch_for

    watch = watch_for(backend, run, act=act, echo=emit.notice)
    if watch is not None:
        watch.on_hang = _told(watch.on_hang, run.run_id, emit)
    if wrap_watch is not None:
        watch = wrap_watch(watch)
    outcome = follower.follow(emit, watch=watch, signals=signals, leave=leave)
    emit(RunEnded(run.run_id, outcome, str(run.root)))
    if act and not outcome.left:  # who acts on the run gives its MLflow parent run the end (a restart: again)
        mark_parent(run.plan, end_status(outcome.state), emit)
    copied = getattr(follower, "copied", None)  # the nodes' own files, still on their way here once the end is said
    fetched = copied() if copied is not None else None
    failure = outcome.first_failure
    if act and outcome.state.is_failure and (failure is None or failure.kind == "exit"):
        flight_after_failure(backend, run, echo=emit.notice, fetched=fetched)
    if outcome.interrupted_by is not None and not signals:
        raise KeyboardInterrupt
    return outcome


def _told(on_hang: Callable[[float], HangVerdict], run_id: str, emit: Emitter) -> Callable[[float], HangVerdict]:
    """The watchdog's handler, its verdict also said as a ``HangSuspected`` event."""

    def judged(silent: float) -> HangVerdict:
        verdict = on_hang(silent)
        emit(HangSuspected(run_id, silent, verdict.failure.describe(), verdict.stop))
        return verdict
    return judged


def follow_from_outside(backend: Backend, run: RunDir, emit: Emitter, *, signals: bool,
                        leave: Optional[threading.Event] = None, collect: bool = False) -> Outcome:
    """Follow a run this process did not start: a detached or scheduled run has no owner, so whoever
    follows it acts on a hang; someone else's foreground run, or a detached one its follower restarts
    (``owned_elsewhere``), is only reported on. ``collect``: be the run's collector unless another
    process is (a detached run's follower, ``Run.wait``)."""
    from ..live.layout import ownerless

    return follow(backend, run, backend.attach(run, collect=collect), emit, signals=signals,
                  act=ownerless(run.root, run.record.detached), leave=leave)


OWNER_AHEAD_SECONDS = 5.0
"""How long run.json may say an attempt ended (or the next began) while a viewer still follows it:
the viewer then leaves it (its own link to a cut node would hold it for minutes)."""


def follow_attempts_from_outside(backend: Backend, run: RunDir, emit: Emitter, *, signals: bool,
                                 leave: threading.Event, collect: bool = False) -> tuple[RunDir, Outcome]:
    """``follow_from_outside``, on through the next attempts that the run's owner (its launcher, or a
    detached run's follower) starts while it holds ``owner_lock``: the run as it now is and how it
    ended (its owner's record, once it has one)."""
    from ..live.layout import owned_elsewhere
    from ..rundir.rundir import load_run

    while True:
        attempt, done, gone = run.plan.attempt, threading.Event(), threading.Event()
        detached = run.record.detached  # (the next attempt's record says so only once it has started)
        watcher = threading.Thread(target=_watch_record, args=(run, attempt, leave, done, gone), daemon=True,
                                   name="fsdpctl-attempt-watch")
        watcher.start()
        try:
            outcome = follow_from_outside(backend, run, Emitter(_AttemptView(emit, gone, leave)), signals=signals,
                                          leave=gone, collect=collect)
        finally:
            done.set()
        if leave.is_set() or outcome.interrupted_by is not None:
            return run, outcome
        while run.record.attempt == attempt and owned_elsewhere(run.root) and not leave.wait(0.5):
            pass
        now = load_run(run.root)
        if now.plan.attempt == attempt:  # the run ended here (or this one stopped waiting)
            if not now.record.state.is_over:
                return now, outcome
            if outcome.left and not leave.is_set():  # its end, as the process that recorded it saw it
                emit(RunEnded(run.run_id, now.record.outcome(), str(run.root)))
            return now, now.record.outcome()
        by = "the run's follower in the background" if detached else "its launcher"
        emit.notice(f"run {run.run_id}: attempt {now.plan.attempt}, started by {by}")
        run = now


def _watch_record(run: RunDir, attempt: int, leave: threading.Event, done: threading.Event,
                  gone: threading.Event) -> None:
    """Set ``gone`` once ``leave`` is, or once run.json has said for ``OWNER_AHEAD_SECONDS`` that
    ``attempt`` is over (another process recorded its end, or began the next)."""
    import time

    since = None
    while not done.wait(0.5):
        if leave.is_set():
            break
        record = run.record
        if record.attempt == attempt and not record.state.is_over:
            since = None
            continue
        since = since if since is not None else time.monotonic()
        if time.monotonic() - since >= OWNER_AHEAD_SECONDS:
            break
    gone.set()


class _AttemptView:
    """The events of following one attempt, without the "stopped following" of a viewer that left an
    attempt whose end another process recorded (it follows on, or says that end instead)."""

    def __init__(self, emit: Emitter, gone: threading.Event, leave: threading.Event):
        self.emit, self.gone, self.leave = emit, gone, leave

    def __call__(self, event) -> None:
        ahead = self.gone.is_set() and not self.leave.is_set()  # left for the record's word, not by choice
        if not (isinstance(event, RunEnded) and event.outcome.left and ahead):
            self.emit(event)

    def lines(self, batch) -> None:
        self.emit.lines(batch)

    def flush(self) -> None:
        self.emit.flush()
