"""``launch``, ``submit`` and ``prepare``: a run of your program (or of the bundled workload) on every
node of a profile, started and, unless detached, followed to its end."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from time import time as wall_clock  # submit() has a parameter named time
from typing import TYPE_CHECKING, Any, Optional, Union

from ..errors import UsageError
from .events import Emitter, EventHandler
from .options import Command, JobOptions, PathLike, resolve_options
from .prepare import Prepared, ProfileLike, prepare_run
from .run import Run

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..rundir.rundir import RunDir

SUBMIT_BACKEND = "slurm"
"""The scheduler ``submit`` goes through (``fsdpctl submit --slurm``; the only one so far)."""



def prepare(profile: Optional[ProfileLike] = None, command: Optional[Command] = None, *, slurm: bool = False,
            options: Optional[JobOptions] = None, runs_dir: Optional[PathLike] = None, **values: Any) -> Prepared:
    """The plan of a run and its rendered scripts, as ``launch`` (or with ``slurm``, ``submit``)
    would start it, touching nothing: ``.plan``, ``.scripts``, ``.previews()``. Takes the same
    keyword arguments as ``launch`` (or one ``options``)."""
    prepared = prepare_run(profile, resolve_options(options, command, values),
                           backend=SUBMIT_BACKEND if slurm else None,
                           runs_dir=Path(runs_dir) if runs_dir is not None else None)
    if not slurm:
        refuse_queued(prepared)
    return prepared


def refuse_queued(prepared: Prepared) -> None:
    """``launch`` starts runs on nodes it reaches; a scheduler's profile is submitted instead."""
    if prepared.queued:
        raise UsageError(f"profile {prepared.loaded.name}: runs through {prepared.plan.backend}, a scheduler",
                         f"use `fsdpctl submit --{prepared.plan.backend} --profile {prepared.loaded.name}`")


def launch(profile: Optional[ProfileLike] = None, command: Optional[Command] = None, *,
           code: Optional[PathLike] = None, env: Union[Mapping[str, str], Sequence[str], None] = None,
           secrets: Sequence[str] = (), requirements: Optional[PathLike] = None, job: Optional[str] = None,
           nproc_per_node: Optional[int] = None, detach: bool = False, preflight: bool = True,
           fetch: Sequence[str] = (), hang_timeout: Optional[int] = None, max_restarts: Optional[int] = None,
           options: Optional[JobOptions] = None, on_event: Optional[EventHandler] = None,
           handle_signals: bool = False, runs_dir: Optional[PathLike] = None, **values: Any) -> Run:
    """Start ``command`` (your program: ``["train.py", "--lr", "3e-4"]``, ``["-m", "pkg.train"]``)
    or, without one, the bundled FSDP/FSDP2 GPT on every node of ``profile``, and return its Run.

    First doctor's fast checks on the nodes (``preflight``; a failure raises PreflightError and
    nothing starts), then one torchrun per node. ``detach=False`` follows the run to its end as the
    CLI does (failing fast, restarting up to ``max_restarts`` times, fetching ``fetch`` paths back)
    and returns the Run once it has ended; ``detach=True`` returns at once and the run outlives this
    process (a follower in the background restarts it, shrinks it or grows it back as the launcher
    would). Lines and progress reach ``on_event``.

    ``code``: the folder copied for your program (default: the current one); ``env``: variables for
    every rank (a mapping, or ``NAME=VALUE`` strings); ``secrets``: names of variables whose values
    are taken from this environment and reach the ranks only. Other options: ``no_code``,
    ``chdir``, ``code_limit_mb``, ``master_port``, ``debug``, ``node_timeout``, ``on_hang``. Every
    other keyword is a setting of the bundled workload (``fsdp=2, steps=200, lr=1e-3``). All of
    them may come as one ``options`` (``fsdpctl.JobOptions``) instead.
    ``handle_signals``: take SIGINT/SIGTERM/SIGHUP over while following (the CLI does); otherwise a
    KeyboardInterrupt stops every node of the run, then propagates. ``runs_dir``: where run
    directories go (default ``$FSDPCTL_RUNS_DIR``, else ``./runs``)."""
    opts = resolve_options(options, command, {
        "code": code, "env": env, "secrets": secrets, "requirements": requirements, "job": job,
        "nproc_per_node": nproc_per_node, "hang_timeout": hang_timeout, "max_restarts": max_restarts, **values})
    if fetch and detach:
        raise UsageError("--fetch: a detached launch does not wait for the end", "fetch later: fsdpctl fetch RUN PATH")
    began = wall_clock()
    prepared = prepare_run(profile, opts, runs_dir=Path(runs_dir) if runs_dir is not None else None)
    time_plan(prepared, began)
    refuse_queued(prepared)
    fetch = tuple(fetch) or prepared.job.fetch
    if fetch and detach:
        raise UsageError("--fetch: a detached launch does not wait for the end", "fetch later: fsdpctl fetch RUN PATH")
    emit = Emitter(on_event)
    return start_prepared(prepared, emit, preflight=preflight, detach=detach, fetch=fetch, signals=handle_signals)


def submit(profile: Optional[ProfileLike] = None, command: Optional[Command] = None, *,
           nodes: Optional[int] = None, time: Optional[str] = None, partition: Optional[str] = None,
           via: Optional[str] = None, requeue: Optional[bool] = None, spares: Optional[int] = None,
           follow: bool = False,
           options: Optional[JobOptions] = None, on_event: Optional[EventHandler] = None,
           handle_signals: bool = False, runs_dir: Optional[PathLike] = None, **values: Any) -> Run:
    """Submit the same job through Slurm (``sbatch``, or submitit's executor with ``via="submitit"``)
    and return its Run at once (``follow``: after following it to its end). The run directory, your
    code included, goes once to storage every node shares. ``nodes``, ``time``, ``partition``,
    ``via``, ``requeue`` and ``spares`` (nodes held to continue on when one fails) override the
    profile's ``slurm`` section; the other keywords are ``launch``'s."""
    opts = resolve_options(options, command, {"nodes": nodes, "time": time, "partition": partition, "via": via,
                                              "requeue": requeue, "spares": spares, **values})
    began = wall_clock()
    prepared = prepare_run(profile, opts, backend=SUBMIT_BACKEND,
                           runs_dir=Path(runs_dir) if runs_dir is not None else None)
    time_plan(prepared, began)
    return start_prepared(prepared, Emitter(on_event), preflight=False, detach=not follow, fetch=(),
                          signals=handle_signals)


def time_plan(prepared: Prepared, began: float) -> None:
    """The launch's first phases on its timeline: this process's start (for the CLI, which says when
    it began) and the profile and plan."""
    from ..rundir import timeline

    started = timeline.take_process_start()
    plan = prepared.plan
    line = timeline.timeline_for(plan.run_id, plan.attempt, origin=started if started is not None else began)
    if started is not None:
        line.begin("startup", at=started)
        line.end("startup", at=began)
    line.begin("plan", at=began)
    line.end("plan")


def start_prepared(prepared: Prepared, emit: Emitter, *, preflight: bool, detach: bool, fetch: tuple[str, ...],
                   signals: bool) -> Run:
    """Preflight, create the run directory, start (or submit) the run, and unless detached follow it
    to its end, starting it again after a failure while restarts are left."""
    from ..backends import backend_for
    from ..rundir.rundir import create_run
    from .estimate import memory_warning
    from .notifying import notifier_for
    from .parent_run import mark_parent, with_parent_run
    from .restarting import run_attempt

    for warning in prepared.warnings:
        emit.notice(f"warning: {warning}", "warning")
    memory = memory_warning(prepared)
    if memory is not None:
        emit.notice(f"warning: {memory}", "warning")
    # Notice targets that cannot work stop the launch here, detached or not (a detached run's notices
    # are its follower's to send), before the MLflow parent run is made.
    notifier = notifier_for(prepared.loaded.profile.notify, emit, send=not detach)
    emit = notifier or emit
    # The last step before anything starts (the scripts the preflight stages must carry its id).
    prepared = with_parent_run(prepared, emit)
    loaded, plan = prepared.loaded, prepared.plan
    backend = backend_for(loaded.profile, plan.backend)
    opened: list[RunDir] = []

    def open_run() -> RunDir:
        opened.append(_created(create_run(plan, loaded.profile, prepared.scripts, loaded.text, prepared.inputs),
                               prepared))
        return opened[0]

    try:
        if preflight and prepared.spares:
            check_spares(backend, prepared, emit)
        run_dir = run_attempt(backend, plan, prepared.payload(), emit, preflight=preflight, detach=detach,
                              signals=signals, fetch=fetch, open_run=open_run)
    except BaseException as exc:
        # Nobody else gives its parent run an end: it never started (a failed preflight, a missing
        # secret), or this process failed while starting or following it before its end was recorded.
        if not opened or not opened[0].record.state.is_over:
            mark_parent(plan, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED", emit)
        raise
    finally:
        backend.close()  # the Run opens its connections again when asked
        if notifier is not None:
            notifier.close()
    return Run(run_dir, backend)


def _created(run: RunDir, prepared: Prepared) -> RunDir:
    """A new run's directory, with the spares it runs on in the place of excluded hosts recorded."""
    if prepared.replacements:
        run.change(replacements=prepared.replacements)
    if prepared.resize is not None:
        run.change(resize=prepared.resize)
    return run


def check_spares(backend: Backend, prepared: Prepared, emit: Emitter) -> None:
    """doctor's fast checks on the spares too, beside the run's hosts, so a bad spare is known (and
    never chosen) before it is needed: one that fails is excluded for the profile, with why."""
    from ..hostpool.blame import unfit_hosts
    from ..hostpool.store import Exclusion, add_exclusions
    from ..rundir.record import now

    hosts = [h.host for h in prepared.placed_hosts]
    report = backend.check_hosts([*prepared.placed_hosts, *prepared.spares], environment=prepared.plan.environment)
    unfit = {host: why for host, why in unfit_hosts(report, trusted=hosts).items() if host not in hosts}
    passed = [h.host for h in prepared.spares if h.host not in unfit]
    emit.notice(f"spare host(s) checked: {', '.join(passed) or 'none'} pass{'es' if len(passed) == 1 else ''}")
    when = now()
    add_exclusions(prepared.loaded.name, [Exclusion(host, f"failed the preflight: {why}", prepared.plan.run_id, when)
                                          for host, why in unfit.items()])
    for host, why in unfit.items():
        emit.notice(f"spare {host} failed its check and is excluded until restored: {why}", "warning")
