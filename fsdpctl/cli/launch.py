"""``fsdpctl launch``: run the bundled workload on every node of a profile."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import UsageError
from . import common

# Library modules are imported inside the commands: `fsdpctl --help` must not pay for jinja2,
# yaml and the launch machinery it never uses.


def launch(
    profile: str = common.ProfileOpt,
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
    detach: bool = typer.Option(False, "--detach", help="Start the run and return; follow it with `fsdpctl logs -f`."),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="Skip doctor's checks before starting."),
) -> None:
    """Start the bundled FSDP/FSDP2 GPT training on every node of PROFILE."""
    from ..plan.render import render_all
    from ..plan.types import Overrides
    from .show import print_dry_run

    train = common.train_overrides(fsdp=fsdp, preset=preset, steps=steps, epochs=epochs,
                                   batch_size=batch_size, sharding=sharding,
                                   mixed_precision=mixed_precision, settings=settings)
    overrides = Overrides(train=train, nproc_per_node=nproc_per_node, master_port=master_port, debug=debug)
    loaded, plan = common.build_plan(profile, overrides, for_slurm=False)
    scripts = render_all(plan)
    if dry_run:
        print_dry_run(plan, common.with_previews(loaded.profile, plan, scripts), as_json)
        return
    if as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    raise typer.Exit(run_plan(loaded, plan, scripts, preflight=not no_preflight, detach=detach))


def run_plan(loaded, plan, scripts: dict[str, str], *, preflight: bool, detach: bool, announce_id: bool = False) -> int:
    """Preflight, create the run directory, start (or submit) the run, and unless detached follow it
    to its end; returns the job's exit code. Works the same for every backend. ``announce_id``: print
    the run id on stdout even when following (``submit``'s output starts with it)."""
    from ..backends import backend_for
    from ..runs.record import create_run
    from .report import print_report, progress

    backend = backend_for(loaded.profile, plan.backend)
    try:
        if preflight:
            typer.echo(f"fsdpctl: preflight of {plan.num_nodes} node(s)", err=True)
            report = backend.preflight(plan, on_host=progress)
            if report is not None and not report.ok():
                print_report(report)
                typer.secho("fsdpctl: preflight failed; nothing was started (--no-preflight skips it)",
                            err=True, fg="red")
                return 1
        run = create_run(plan, loaded.profile, scripts, loaded.path.read_text(encoding="utf-8"))
        how = backend.start(run, scripts, detached=detach)
        if detach or announce_id:
            typer.echo(plan.run_id)
        typer.echo(f"fsdpctl: run {plan.run_id} {how}; run directory {run.root}", err=True)
        if detach:
            typer.echo(f"fsdpctl: detached; follow with `fsdpctl logs -f {plan.run_id}`, "
                       f"end with `fsdpctl stop {plan.run_id}`", err=True)
            return 0
        return follow_run(backend, run, owner=True)
    finally:
        backend.close()


def follow_run(backend, run, *, owner: bool, sink=None) -> int:
    """Follow a run to its end through its backend, print how it ended; its exit code."""
    from .stream import LinePrinter

    printer = LinePrinter(total_steps=run.plan.train.get("steps"))
    outcome = backend.follow(run, sink or printer, owner=owner)
    printer.summary(run.run_id, outcome, run.root)
    return outcome.exit_code
