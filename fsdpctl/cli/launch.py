"""``fsdpctl launch``: run your program, or the bundled workload, on every node of a profile."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from . import common, jobopts

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
) -> None:
    """Start your program (after --) or the bundled FSDP/FSDP2 GPT training on every node of PROFILE.

    \b
    fsdpctl launch -p two-node -- train.py --epochs 3
    fsdpctl launch -p two-node --code ~/proj --env WANDB_PROJECT=demo -- -m proj.train --lr 3e-4
    fsdpctl launch --job nightly          (./jobs/nightly.yaml: command, code, env, requirements)
    fsdpctl launch -p two-node            (the bundled GPT: checks the cluster end to end)"""
    from .show import print_dry_run

    prepared = jobopts.prepare(
        profile=profile, for_slurm=False,
        flags=jobopts.job_flags(command, job, code, no_code, chdir, code_limit, env, requirements),
        workload={"fsdp": fsdp, "preset": preset, "steps": steps, "epochs": epochs, "batch_size": batch_size,
                  "sharding": sharding, "mixed_precision": mixed_precision, "settings": settings},
        nproc_per_node=nproc_per_node, master_port=master_port, debug=debug, node_timeout=node_timeout,
        hang_timeout=common.hang_timeout_choice(hang_timeout), on_hang=common.on_hang_choice(on_hang))
    if dry_run:
        print_dry_run(prepared.plan, common.with_previews(prepared.loaded.profile, prepared.plan, prepared.scripts),
                      as_json)
        return
    if as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    wanted = tuple(fetch or ()) or prepared.job.fetch
    if wanted and detach:
        raise UsageError("--fetch: a detached launch does not wait for the end", "fetch later: fsdpctl fetch RUN PATH")
    raise typer.Exit(run_plan(prepared, preflight=not no_preflight, detach=detach, fetch=wanted))


def run_plan(prepared: jobopts.Prepared, *, preflight: bool, detach: bool, announce_id: bool = False,
             fetch: tuple[str, ...] = ()) -> int:
    """Preflight, create the run directory, start (or submit) the run, and unless detached follow it
    to its end; returns the job's exit code. Works the same for every backend. ``announce_id``: print
    the run id on stdout even when following (``submit``'s output starts with it)."""
    from ..backends import backend_for
    from ..runs.record import create_run
    from .report import print_report, progress

    loaded, plan = prepared.loaded, prepared.plan
    payload = prepared.payload()
    backend = backend_for(loaded.profile, plan.backend)
    try:
        if preflight:
            typer.echo(f"fsdpctl: preflight of {plan.num_nodes} node(s)", err=True)
            report = backend.preflight(plan, payload, on_host=progress)
            if report is not None and not report.ok():
                print_report(report)
                typer.secho("fsdpctl: preflight failed; nothing was started (--no-preflight skips it)",
                            err=True, fg="red")
                return 1
        run = create_run(plan, loaded.profile, prepared.scripts, loaded.path.read_text(encoding="utf-8"))
        how = backend.start(run, payload, detached=detach)
        if detach or announce_id:
            typer.echo(plan.run_id)
        typer.echo(f"fsdpctl: run {plan.run_id} {how}; run directory {run.root}", err=True)
        if detach:
            typer.echo(f"fsdpctl: detached; follow with `fsdpctl logs -f {plan.run_id}`, "
                       f"end with `fsdpctl stop {plan.run_id}`", err=True)
            return 0
        code = follow_run(backend, run, owner=True)
        for path in fetch:
            show_fetched(backend.fetch(run, path))
        return code
    finally:
        backend.close()


def follow_run(backend, run, *, owner: bool, sink=None) -> int:
    """Follow a run to its end through its backend, print how it ended; its exit code."""
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
    return outcome.exit_code


def show_fetched(fetched: dict[str, list[str]]) -> None:
    """One line per node: how many files came back and where they are, or that none did."""
    import os

    for where, files in fetched.items():
        if not files:
            typer.echo(f"fsdpctl: fetched from {where}: nothing (no such path)", err=True)
            continue
        folder = os.path.commonpath(files) if len(files) > 1 else files[0]
        typer.echo(f"fsdpctl: fetched from {where}: {len(files)} file(s) in {folder}", err=True)
