"""A foreground run followed to its end, and started again after a failure while its restarts last:
on healthy hosts, the node to blame left out and the first spare that passes the re-check in its
place, every exclusion remembered for the profile.

The rule (``hostpool.blame``): a node is to blame when it was lost, when its ranks died by a signal
no other node's got, or when it fails the re-check. A blamed node is replaced when a spare is left;
without one it is re-checked, and the next attempt runs on it again if it passes. A host that fails
the re-check with no spare left ends the run at once, naming the hosts missing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Optional

from ..rundir.state import NodeState, RunState
from .elastic import change_of
from .events import AttemptStarting, Emitter, Fetched
from .following import check, follow, start_attempt
from .recovery import RecoveryClock

if TYPE_CHECKING:
    from ..backends.base import Backend, Follower
    from ..bundle import Payload
    from ..plan.types import LaunchPlan
    from ..rundir.rundir import RunDir
    from ..rundir.state import Outcome
    from .attempts import NextAttempt


def start_on_healthy_hosts(backend: Backend, run: RunDir, attempt: NextAttempt, emit: Emitter, *,
                           detached: bool = False) -> Optional[tuple[RunDir, Follower]]:
    """Re-check and start ``attempt`` of the failed ``run``: on a backend that ``takes_spares``, with
    each node to blame (and each host that fails the re-check) replaced by a spare. None when it
    cannot start (said as a notice): a re-check failed and no spare was left to replace the host.
    ``detached``: the attempt outlives this process as the run's first did (its follower starts it)."""
    from ..hostpool.blame import nodes_to_blame, unfit_hosts
    from ..hostpool.choice import choose_hosts
    from ..hostpool.placing import excluded_hosts
    from ..plan.elastic_policy import goes_on_short, goes_without, min_nodes_in
    from ..rundir.attempts import begin_attempt
    from ..rundir.paths import read_json
    from ..rundir.rundir import INPUTS
    from .attempts import plan_next_attempt, profile_now
    from .restart_causes import hardware_faults

    number = attempt.plan.attempt
    if not backend.takes_spares:
        started = start_attempt(backend, attempt.plan, attempt.payload(), emit, detached=detached, spawn=False,
                                recheck=True,
                                open_run=functools.partial(begin_attempt, run, attempt.plan, attempt.scripts,
                                                           attempt.from_step))
        if started is None:
            emit.notice(f"run {run.run_id} ends: a node failed its re-check before attempt {number} (above); "
                        f"nothing of it was started", "error")
        return started
    profile = profile_now(run, emit)  # with a spare added to the profile file while the run went
    before = excluded_hosts(profile, tuple((read_json(run.root / INPUTS) or {}).get("exclude") or ()))
    suspects = nodes_to_blame(run.record.nodes, hardware_faults(run))
    lost = {n.host for n in run.record.nodes if n.state is NodeState.LOST}
    elastic = run.plan.elastic
    blamed: dict[str, str] = {}
    for host, why in suspects.items():
        without = choose_hosts(profile, {**before, **blamed, host: why})
        if not without.missing:
            blamed[host] = why
        elif goes_without(elastic, lost=host in lost, hosts_left=len(without.hosts)):
            # it comes back by `hosts --restore` or the run's own re-check (``elastic.recheck``)
            blamed[host] = why
            emit.notice(f"{host}: {why}; no spare left to take its place: attempt {number} goes on without it "
                        f"(elastic)", "warning")
        else:
            emit.notice(f"{host}: {why}; no spare left to take its place: it is re-checked, and attempt {number} "
                        f"runs on it again if it passes", "warning")
    trusted = [n.host for n in run.record.nodes if n.host not in suspects]
    while True:
        excluded = {**before, **blamed}
        choice = choose_hosts(profile, excluded)
        if choice.missing and not goes_on_short(elastic, len(choice.hosts)):
            _remember(run, blamed)
            below = f"; fewer than min_nodes {min_nodes_in(elastic)} left" if elastic is not None else ""
            emit.notice(f"run {run.run_id} ends: {choice.shortage(excluded)}{below}", "error")
            return None
        for replacement in choice.replacements:
            if replacement.host in blamed:
                emit.notice(f"{replacement.by} replaces {replacement.host} for attempt {number}: {replacement.why}",
                            "warning")
        change = change_of(run, choice, excluded, emit) if len(choice.hosts) != run.plan.num_nodes else None
        if change is not None and change.refused:
            _remember(run, blamed)
            emit.notice(f"run {run.run_id} ends: it cannot go on with {len(choice.hosts)} nodes: {change.refused}",
                        "error")
            return None
        plan, scripts = plan_next_attempt(backend, run, train={}, profile=choice.profile, full_nodes=choice.full,
                                          batch_limit=change.batch.limit if change is not None else None)
        payload = dataclasses.replace(attempt, plan=plan, scripts=scripts).payload()  # its own node scripts
        checked = check(backend, plan, payload, emit, recheck=True)
        if checked.ok:
            break
        unfit = unfit_hosts(checked.report, trusted) if checked.report is not None else {}
        if not unfit:
            emit.notice(f"run {run.run_id} ends: the re-check before attempt {number} failed (above) and names no "
                        f"host to replace; nothing of it was started", "error")
            _remember(run, blamed)
            return None
        blamed.update({host: f"failed the re-check: {why}" for host, why in unfit.items()})
    _remember(run, blamed)
    replacements, resize = choice.replacements, change.record if change is not None else None
    if resize is not None:
        emit.notice(f"run {run.run_id} goes on: attempt {number} {resize.describe()} (elastic, min_nodes "
                    f"{min_nodes_in(elastic)})", "warning")
    return start_attempt(backend, plan, payload, emit, detached=detached, spawn=False, checked=checked,
                         open_run=lambda: _begun(begin_attempt(run, plan, scripts, attempt.from_step), replacements,
                                                 resize))


def _begun(run: RunDir, replacements, resize=None) -> RunDir:
    if replacements or resize:
        run.change(**({"replacements": replacements} if replacements else {}),
                   **({"resize": resize} if resize else {}))
    return run


def _remember(run: RunDir, blamed: dict[str, str]) -> None:
    """Keep the hosts excluded for the profile, with why, the run and the time."""
    from ..hostpool.store import Exclusion, add_exclusions
    from ..rundir.record import now

    if blamed:
        when = now()
        add_exclusions(run.profile.name, [Exclusion(host, why, run.run_id, when) for host, why in blamed.items()])


def run_attempt(backend: Backend, plan: LaunchPlan, payload: Payload, emit: Emitter, *,
                open_run: Callable[[], RunDir], preflight: bool, detach: bool, signals: bool,
                fetch: tuple[str, ...] = ()) -> RunDir:
    """Start an attempt (``start_attempt``) and, unless detached, follow it to its end, restarting
    while the run's restarts last; the run as it now is."""
    started = start_attempt(backend, plan, payload, emit, open_run=open_run, detached=detach, preflight=preflight)
    assert started is not None  # a first preflight raises rather than return nothing
    run, follower = started
    if not detach:
        run, _ = follow_with_restarts(backend, run, follower, emit, signals=signals, fetch=fetch)
    return run


def follow_with_restarts(backend: Backend, run: RunDir, follower: Follower, emit: Emitter, *, signals: bool,
                         fetch: tuple[str, ...] = (), detached: bool = False) -> tuple[RunDir, Outcome]:
    """Follow a foreground run this process started to its end; after a failure, re-check the nodes
    and start the next attempt while the run's restarts last (shrinking or growing an elastic run);
    then fetch. The run as it now is (its last attempt) and how it ended. ``detached``: this is a
    detached run's follower (``background``), and each attempt it starts is detached too. While the
    run may start again, this process owns it (``owner_lock``): viewers follow it into its next attempts."""
    import contextlib

    from ..live.layout import owner_lock

    with owner_lock(run.root) if may_start_again(run.plan) else contextlib.nullcontext():
        return _follow_with_restarts(backend, run, follower, emit, signals=signals, fetch=fetch, detached=detached)


def may_start_again(plan: LaunchPlan) -> bool:
    """The run may have a next attempt after a failure: restarts (``max_restarts``) or a change of
    size (``elastic``)."""
    return bool(plan.max_restarts or plan.elastic is not None)


def _follow_with_restarts(backend: Backend, run: RunDir, follower: Follower, emit: Emitter, *, signals: bool,
                          fetch: tuple[str, ...], detached: bool) -> tuple[RunDir, Outcome]:
    from .attempts import plan_restart
    from .growing import GrowWatch, short_of_nodes

    plan = run.plan
    last_attempt = plan.attempt + plan.max_restarts
    clock = RecoveryClock(emit) if (plan.max_restarts or plan.elastic) and not plan.command else None
    emit = clock or emit

    def following(run: RunDir, follower: Follower) -> tuple[Outcome, Optional[GrowWatch]]:
        grow = GrowWatch(run, emit) if short_of_nodes(run) and backend.takes_spares else None
        outcome = follow(backend, run, follower, emit, signals=signals, act=True,
                         wrap_watch=grow.around if grow is not None else None)
        return outcome, grow

    outcome, grow = following(run, follower)
    while outcome.exit_code != 0 or (grow is not None and grow.fired):
        if grow is not None and grow.fired:
            last_attempt += 1  # a planned growth spends no restart
            attempt, after = plan_growth(backend, run), f"growing back to {len(grow.grow_to.hosts)} nodes"
        else:
            attempt, after = plan_restart(backend, run, outcome, last_attempt)
        if attempt is None:
            if after:
                emit.notice(after, "warning")
            break
        emit(AttemptStarting(plan.run_id, attempt.plan.attempt, last_attempt, attempt.from_step, after or ""))
        started = start_on_healthy_hosts(backend, run, attempt, emit, detached=detached)
        if started is None:
            break
        run, follower = started
        if clock is not None:
            clock.restarted(run, attempt.from_step)
        outcome, grow = following(run, follower)
    if outcome.state is RunState.INTERRUPTED:  # a person's or a job system's signal: the ranks had time to save
        run.change(stop_checkpoint=backend.stop_checkpoint(run))
    for path in fetch:
        emit(Fetched(backend.fetch(run, path)))
    return run, outcome


def plan_growth(backend: Backend, run: RunDir) -> Optional[NextAttempt]:
    """The attempt that follows one stopped at a checkpoint to grow: from that checkpoint."""
    from .attempts import NextAttempt, checkpoint_steps, plan_next_attempt

    saved = [] if run.plan.command else checkpoint_steps(backend, run)
    plan, scripts = plan_next_attempt(backend, run, train={})
    return NextAttempt(plan, scripts, saved[-1] if saved else None)
