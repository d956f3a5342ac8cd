"""``fsdpctl submit --slurm``: the same job as a Slurm batch script."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from . import common


def submit(
    profile: str = common.ProfileOpt,
    slurm: bool = typer.Option(False, "--slurm", help="Submit through Slurm (the only scheduler so far)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes to allocate (overrides slurm.nodes)."),
    time: Optional[str] = typer.Option(None, "--time", help="Time limit, e.g. 02:00:00 (overrides slurm.time)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="Partition (overrides slurm.partition)."),
    via: Optional[str] = typer.Option(None, "--via", help="sbatch (fsdpctl's batch script) or submitit "
                                      "(overrides slurm.via)."),
    requeue: Optional[bool] = typer.Option(None, "--requeue/--no-requeue", help="Checkpoint on SIGUSR2 before the "
                                           "time limit and requeue; resume when requeued (overrides slurm.requeue)."),
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
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow the job's logs until it ends."),
) -> None:
    """Submit the bundled FSDP/FSDP2 GPT training as a Slurm job (sbatch or submitit)."""
    from ..plan.render import render_all
    from ..plan.types import Overrides
    from .show import print_dry_run

    if not slurm:
        raise UsageError("submit needs a scheduler", "add --slurm")
    _check_slurm_values(nodes, time, partition, via)
    train = common.train_overrides(fsdp=fsdp, preset=preset, steps=steps, epochs=epochs,
                                   batch_size=batch_size, sharding=sharding,
                                   mixed_precision=mixed_precision, settings=settings)
    overrides = Overrides(train=train, nproc_per_node=nproc_per_node, master_port=master_port, debug=debug,
                          slurm_nodes=nodes, slurm_time=time, slurm_partition=partition,
                          slurm_requeue=requeue, slurm_via=via)
    loaded, plan = common.build_plan(profile, overrides, for_slurm=True)
    scripts = render_all(plan)
    from ..backends.slurm import submit as slurm_submit

    if dry_run:
        if plan.slurm is not None and plan.slurm.via == "submitit":
            from ..backends.slurm.via_submitit import submitit_preview

            folder, python, params = slurm_submit.submitit_job(plan, Path(plan.run_dir), scripts["submitit-setup.sh"])
            scripts["submitit.sbatch (as submitit will write it)"] = submitit_preview(folder, python, params)
        print_dry_run(plan, scripts, as_json)
        return
    from ..runs.paths import RunPaths

    if as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    paths = RunPaths(Path(plan.local_run_dir))
    job_id = slurm_submit.submit_slurm(paths, plan, scripts, loaded.path.read_text(encoding="utf-8"))
    typer.echo(plan.run_id)
    typer.echo(f"fsdpctl: run {plan.run_id} submitted as Slurm job {job_id}; run directory {plan.run_dir}; "
               f"follow with `fsdpctl logs -f {plan.run_id}`", err=True)
    if follow:
        from .logs import follow_slurm

        raise typer.Exit(follow_slurm(paths.root))


def _check_slurm_values(nodes: Optional[int], time: Optional[str], partition: Optional[str],
                        via: Optional[str]) -> None:
    from ..profiles.schema import SLURM_TIME_PATTERN, SLURM_WORD_PATTERN

    if nodes is not None and nodes < 1:
        raise UsageError(f"--nodes {nodes}: not positive", "give 1 or more")
    if time is not None and not SLURM_TIME_PATTERN.match(time):
        raise UsageError(f"--time {time!r}: not a Slurm time limit", "write e.g. 90, 02:00:00 or 1-00:00")
    if partition is not None and not SLURM_WORD_PATTERN.match(partition):
        raise UsageError(f"--partition {partition!r}: not a partition name", "use letters, digits, _ - .")
    if via is not None and via not in ("sbatch", "submitit"):
        raise UsageError(f"--via {via!r}: unknown", "use --via sbatch or --via submitit")
