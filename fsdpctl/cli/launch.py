"""``fsdpctl launch``: run the bundled workload on every node of a profile."""

from __future__ import annotations

from pathlib import Path
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
) -> None:
    """Start the bundled FSDP/FSDP2 GPT training on every node of PROFILE."""
    from ..plan import Overrides
    from ..render import render_all
    from .show import print_dry_run

    train = common.train_overrides(fsdp=fsdp, preset=preset, steps=steps, epochs=epochs,
                                   batch_size=batch_size, sharding=sharding,
                                   mixed_precision=mixed_precision, settings=settings)
    overrides = Overrides(train=train, nproc_per_node=nproc_per_node, master_port=master_port, debug=debug)
    _, plan = common.build_plan(profile, overrides, for_slurm=False)
    scripts = render_all(plan)
    if dry_run:
        print_dry_run(plan, scripts, as_json)
        return
    if as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    if plan.backend != "local":
        raise UsageError(f"launching a {plan.backend} profile is not available in this version",
                         "use --dry-run and run each printed node script on its node")
    raise typer.Exit(run_local(plan, scripts))


def run_local(plan, scripts: dict[str, str]) -> int:
    """Run the plan on this machine, streaming prefixed output; returns the job's exit code."""
    from ..nodes import prepare_run_dir, start_nodes, supervise
    from ..runs import RunPaths
    from ..transport import LocalTransport

    paths = RunPaths(Path(plan.local_run_dir))
    transports = [LocalTransport() for _ in plan.nodes]
    prepare_run_dir(plan, scripts, paths)
    typer.echo(f"fsdpctl: run {plan.run_id}: {plan.num_nodes} node(s), world size {plan.world_size}; "
               f"logs in {paths.root}", err=True)
    states = start_nodes(plan, scripts, transports)
    result = supervise(plan, states, transports, paths, _print_line)
    if result.interrupted:
        typer.echo(f"fsdpctl: run {plan.run_id} interrupted; every node stopped", err=True)
    elif result.first_failure:
        failure = result.first_failure
        typer.secho(f"fsdpctl: run {plan.run_id} FAILED: node {failure['node_rank']} ({failure['host']}) "
                    f"exited {failure['exit_code']}; other nodes stopped. Last lines:", err=True, fg="red")
        for line in failure["last_lines"]:
            typer.echo(f"  {line}", err=True)
    else:
        typer.echo(f"fsdpctl: run {plan.run_id} succeeded; run directory {paths.root}", err=True)
    return result.exit_code


_COLOURS = ["cyan", "magenta", "yellow", "green", "blue", "bright_cyan", "bright_magenta", "bright_yellow"]


def _print_line(node_rank: int, host: str, line: str) -> None:
    prefix = typer.style(f"[{host} r{node_rank}]", fg=_COLOURS[node_rank % len(_COLOURS)])
    metrics = "step=" in line and "loss=" in line
    typer.echo(f"{prefix} {typer.style(line, bold=True) if metrics else line}")
