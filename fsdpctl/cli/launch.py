"""``fsdpctl launch``: run your program, or the bundled workload, on every node of a profile."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from . import common, jobopts
from .resume import ResumeOpt, refuse_flags_with_resume

# Library modules are imported inside the commands: `fsdpctl --help` must not pay for jinja2,
# yaml and the launch machinery it never uses.


def launch(
    command: Optional[list[str]] = jobopts.CommandArg,
    profile: Optional[str] = common.JobProfileOpt,
    job: Optional[str] = jobopts.JobOpt,
    code: Optional[Path] = jobopts.CodeOpt,
    no_code: bool = jobopts.NoCodeOpt,
    chdir: Optional[str] = jobopts.ChdirOpt,
    code_limit: Optional[int] = jobopts.CodeLimitOpt,
    env: Optional[list[str]] = jobopts.EnvOpt,
    requirements: Optional[Path] = jobopts.RequirementsOpt,
    fsdp: Optional[int] = common.FsdpOpt,
    preset: Optional[str] = common.PresetOpt,
    steps: Optional[int] = common.StepsOpt,
    epochs: Optional[int] = common.EpochsOpt,
    batch_size: Optional[int] = common.BatchOpt,
    sharding: Optional[str] = common.ShardingOpt,
    mixed_precision: Optional[str] = common.PrecisionOpt,
    settings: Optional[list[str]] = common.SetOpt,
    nproc_per_node: Optional[int] = common.NprocOpt,
    master_port: Optional[int] = common.PortOpt,
    debug: bool = common.DebugOpt,
    dry_run: bool = common.DryRunOpt,
    as_json: bool = common.JsonOpt,
    detach: bool = typer.Option(False, "--detach", help="Start the run and return; it outlives this command "
                                "(no node timeout). Follow it with `fsdpctl logs -f`, end it with `fsdpctl stop`."),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="Skip doctor's checks before starting."),
    fetch: Optional[list[str]] = typer.Option(None, "--fetch", help="When the run ends, copy this file or folder "
                                              "(under $FSDPCTL_RUN_DIR) back from every node (repeatable)."),
    hang_timeout: Optional[int] = common.HangTimeoutOpt,
    on_hang: Optional[str] = common.OnHangOpt,
    node_timeout: Optional[int] = typer.Option(None, "--node-timeout", min=3, help="Seconds the launcher and a "
                                               "node may hear nothing from each other before the node is lost and "
                                               "stops its own ranks (default: the profile's node_timeout, 30). A "
                                               "--detach run outlives its launcher and is not bound by it."),
    resume: Optional[str] = ResumeOpt,
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", min=0, max=100, help="When a rank or node "
                                               "fails (or the run hangs), tear down, re-check the nodes and start "
                                               "again from the newest complete checkpoint, up to N times (default: "
                                               "the profile's max_restarts, 0). Not with --detach."),
) -> None:
    """Start your program (after --) or the bundled FSDP/FSDP2 GPT training on every node of PROFILE.

    \b
    fsdpctl launch -p two-node -- train.py --epochs 3
    fsdpctl launch -p two-node --code ~/proj --env WANDB_PROJECT=demo -- -m proj.train --lr 3e-4
    fsdpctl launch --job nightly          (./jobs/nightly.yaml: command, code, env, requirements)
    fsdpctl launch -p two-node            (the bundled GPT: checks the cluster end to end)"""
    from .show import print_dry_run

    if max_restarts and detach:
        raise UsageError("--max-restarts: restarts are made by the launcher that follows the run",
                         "drop --detach (or --max-restarts)")
    wanted = tuple(fetch or ())
    if wanted and detach:
        raise UsageError("--fetch: a detached launch does not wait for the end", "fetch later: fsdpctl fetch RUN PATH")
    hang_timeout, on_hang = common.hang_timeout_choice(hang_timeout), common.on_hang_choice(on_hang)
    flags = jobopts.job_flags(command, job, code, no_code, chdir, code_limit, env, requirements)
    workload = {"fsdp": fsdp, "preset": preset, "steps": steps, "epochs": epochs, "batch_size": batch_size,
                "sharding": sharding, "mixed_precision": mixed_precision, "settings": settings}
    if resume is not None:
        refuse_flags_with_resume(flags, workload, profile=profile, nproc_per_node=nproc_per_node,
                                 master_port=master_port, debug=debug, dry_run=dry_run, json=as_json)
        raise typer.Exit(resume_run(resume, for_slurm=False, preflight=not no_preflight, detach=detach,
                                    fetch=wanted, steps=steps, epochs=epochs, node_timeout=node_timeout,
                                    hang_timeout=hang_timeout, on_hang=on_hang, max_restarts=max_restarts))
    prepared = jobopts.prepare(
        profile=profile, for_slurm=False, flags=flags, workload=workload, nproc_per_node=nproc_per_node,
        master_port=master_port, debug=debug, node_timeout=node_timeout, hang_timeout=hang_timeout, on_hang=on_hang,
        max_restarts=max_restarts)
    if dry_run:
        print_dry_run(prepared.plan, common.with_previews(prepared.loaded.profile, prepared.plan, prepared.scripts),
                      as_json)
        return
    if as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    wanted = wanted or prepared.job.fetch
    if wanted and detach:
        raise UsageError("--fetch: a detached launch does not wait for the end", "fetch later: fsdpctl fetch RUN PATH")
    if detach and prepared.plan.max_restarts:
        typer.secho(f"fsdpctl: note: the profile's max_restarts ({prepared.plan.max_restarts}) does not apply to a "
                    f"detached run: restarts are made by the launcher that follows it", err=True, fg="yellow")
    raise typer.Exit(run_plan(prepared, preflight=not no_preflight, detach=detach, fetch=wanted))


def run_plan(prepared: jobopts.Prepared, *, preflight: bool, detach: bool, announce_id: bool = False,
             fetch: tuple[str, ...] = ()) -> int:
    """Preflight, create the run directory, start (or submit) the run, and unless detached follow it
    to its end, starting it again after a failure while restarts are left; returns the job's exit
    code. Works the same for every backend. ``announce_id``: print the run id on stdout even when
    following (``submit``'s output starts with it)."""
    from ..backends import backend_for
    from ..runs.record import create_run

    loaded, plan = prepared.loaded, prepared.plan
    payload = prepared.payload()
    backend = backend_for(loaded.profile, plan.backend)
    try:
        if preflight and not passes_preflight(backend, plan, payload):
            return 1
        run = create_run(plan, loaded.profile, prepared.scripts, loaded.path.read_text(encoding="utf-8"),
                         prepared.inputs)
        return start_and_follow(backend, run, payload, detach=detach, announce_id=announce_id, fetch=fetch)
    finally:
        backend.close()


def resume_run(run_id: str, *, for_slurm: bool, preflight: bool, detach: bool, fetch: tuple[str, ...] = (),
               announce_id: bool = False, steps: Optional[int] = None, epochs: Optional[int] = None,
               **changes) -> int:
    """``--resume RUN_ID``: the run's next attempt in its own directory, started and followed like a
    new run (refused with one line when it cannot continue)."""
    from ..backends import backend_for_run
    from ..runs.attempts import begin_attempt
    from ..runs.paths import find_run
    from ..runs.record import load_run
    from .resume import echo, plan_resume

    run = load_run(find_run(run_id))
    backend = backend_for_run(run)
    try:
        attempt = plan_resume(backend, run, for_slurm=for_slurm, steps=steps, epochs=epochs, **changes)
        payload = attempt.payload()
        if preflight and not passes_preflight(backend, attempt.plan, payload):
            return 1
        where = f"from step {attempt.from_step}" if attempt.from_step is not None else "(your program resumes itself)"
        echo(f"run {run.run_id}: attempt {attempt.plan.attempt} {where}")
        run = begin_attempt(run, attempt.plan, attempt.scripts, attempt.from_step)
        return start_and_follow(backend, run, payload, detach=detach, announce_id=announce_id, fetch=fetch)
    finally:
        backend.close()


def passes_preflight(backend, plan, payload, *, attempt_line: str = "") -> bool:
    """doctor's fast checks on the plan's nodes; prints the report and says nothing started when they fail."""
    from .report import print_report, progress

    typer.echo(f"fsdpctl: {attempt_line}preflight of {plan.num_nodes} node(s)", err=True)
    report = backend.preflight(plan, payload, on_host=progress)
    if report is not None and not report.ok():
        print_report(report)
        typer.secho("fsdpctl: preflight failed; nothing was started (--no-preflight skips it)", err=True, fg="red")
        return False
    return True


def start_and_follow(backend, run, payload, *, detach: bool, announce_id: bool, fetch: tuple[str, ...]) -> int:
    """Start the run's current attempt and, unless detached, follow it to its end; after a failure,
    re-check the nodes and start the next attempt while the run's restarts last."""
    from ..runs.attempts import begin_attempt
    from .resume import echo, plan_restart

    plan = run.plan
    last_attempt = plan.attempt + plan.max_restarts
    how = backend.start(run, payload, detached=detach)
    if detach or announce_id:
        typer.echo(plan.run_id)
    typer.echo(f"fsdpctl: run {plan.run_id} {how}; run directory {run.root}", err=True)
    if detach:
        typer.echo(f"fsdpctl: detached; follow with `fsdpctl logs -f {plan.run_id}`, "
                   f"end with `fsdpctl stop {plan.run_id}`", err=True)
        return 0
    outcome = follow_outcome(backend, run, owner=True)
    while outcome.exit_code != 0:
        attempt, line = plan_restart(backend, run, outcome, last_attempt)
        if attempt is None:
            if line:
                echo(line, "yellow")
            break
        echo(line, "yellow")
        payload = attempt.payload()
        if not passes_preflight(backend, attempt.plan, payload, attempt_line="re-check: "):
            echo(f"run {plan.run_id} ends: a node failed its re-check before attempt {attempt.plan.attempt} "
                 f"(above); nothing of it was started", "red")
            break
        run = begin_attempt(run, attempt.plan, attempt.scripts, attempt.from_step)
        typer.echo(f"fsdpctl: run {plan.run_id} attempt {attempt.plan.attempt} "
                   f"{backend.start(run, payload, detached=False)}", err=True)
        outcome = follow_outcome(backend, run, owner=True)
    for path in fetch:
        show_fetched(backend.fetch(run, path))
    return outcome.exit_code


def follow_run(backend, run, *, owner: bool, sink=None) -> int:
    """Follow a run to its end through its backend, print how it ended; its exit code."""
    return follow_outcome(backend, run, owner=owner, sink=sink).exit_code


def follow_outcome(backend, run, *, owner: bool, sink=None):
    """Follow a run to its end through its backend, print how it ended; the backend's Outcome."""
    from ..diagnose.hang import flight_after_failure, watch_for
    from .stream import LinePrinter

    printer = LinePrinter(total_steps=run.plan.train.get("steps"))
    # A follower of someone else's foreground run only reports a hang; its launcher acts on it. A
    # detached or queued run has no such owner: whoever follows it acts.
    act = owner or bool(run.record.get("detached")) or backend.queued
    watch = watch_for(backend, run, act=act, echo=lambda line: typer.echo(line, err=True))
    outcome = backend.follow(run, sink or printer, owner=owner, watch=watch)
    printer.summary(run.run_id, outcome, run.root)
    failure = outcome.first_failure or {}
    if act and outcome.state == "failed" and not failure.get("hang") and not failure.get("lost"):
        flight_after_failure(backend, run, echo=lambda line: typer.echo(line, err=True))
    return outcome


def show_fetched(fetched: dict[str, list[str]]) -> None:
    """One line per node: how many files came back and where they are, or that none did."""
    import os

    for where, files in fetched.items():
        if not files:
            typer.echo(f"fsdpctl: fetched from {where}: nothing (no such path)", err=True)
            continue
        folder = os.path.commonpath(files) if len(files) > 1 else files[0]
        typer.echo(f"fsdpctl: fetched from {where}: {len(files)} file(s) in {folder}", err=True)
