"""``fsdpctl submit --slurm``: the same job as a Slurm batch script."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from . import common, jobopts
from .launch import resume_run, run_plan
from .resume import ResumeOpt, refuse_flags_with_resume


def submit(
    command: Optional[list[str]] = jobopts.CommandArg,
    profile: Optional[str] = common.JobProfileOpt,
    slurm: bool = typer.Option(False, "--slurm", help="Submit through Slurm (the only scheduler so far)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes to allocate (overrides slurm.nodes)."),
    time: Optional[str] = typer.Option(None, "--time", help="Time limit, e.g. 02:00:00 (overrides slurm.time)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="Partition (overrides slurm.partition)."),
    via: Optional[str] = typer.Option(None, "--via", help="sbatch (fsdpctl's batch script) or submitit "
                                      "(overrides slurm.via)."),
    requeue: Optional[bool] = typer.Option(None, "--requeue/--no-requeue", help="Checkpoint on SIGUSR2 before the "
                                           "time limit and requeue; resume when requeued (overrides slurm.requeue)."),
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
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow the job's logs until it ends."),
    hang_timeout: Optional[int] = common.HangTimeoutOpt,
    on_hang: Optional[str] = common.OnHangOpt,
    resume: Optional[str] = ResumeOpt,
) -> None:
    """Submit your program (after --) or the bundled FSDP/FSDP2 GPT training as a Slurm job (sbatch or
    submitit). The run directory, your code included, goes once to storage every node shares."""
    from .show import print_dry_run

    if not slurm:
        raise UsageError("submit needs a scheduler", "add --slurm")
    _check_slurm_values(nodes, time, partition, via)
    hang_timeout, on_hang = common.hang_timeout_choice(hang_timeout), common.on_hang_choice(on_hang)
    flags = jobopts.job_flags(command, job, code, no_code, chdir, code_limit, env, requirements)
    workload = {"fsdp": fsdp, "preset": preset, "steps": steps, "epochs": epochs, "batch_size": batch_size,
                "sharding": sharding, "mixed_precision": mixed_precision, "settings": settings}
    if resume is not None:
        refuse_flags_with_resume(flags, workload, profile=profile, nodes=nodes, time=time, partition=partition,
                                 via=via, requeue=requeue, nproc_per_node=nproc_per_node, master_port=master_port,
                                 debug=debug, dry_run=dry_run, json=as_json)
        raise typer.Exit(resume_run(resume, for_slurm=True, preflight=False, detach=not follow, announce_id=True,
                                    steps=steps, epochs=epochs, hang_timeout=hang_timeout, on_hang=on_hang))
    prepared = jobopts.prepare(
        profile=profile, for_slurm=True, flags=flags, workload=workload, nproc_per_node=nproc_per_node,
        master_port=master_port, debug=debug, slurm_nodes=nodes, slurm_time=time, slurm_partition=partition,
        slurm_requeue=requeue, slurm_via=via, hang_timeout=hang_timeout, on_hang=on_hang)
    if dry_run:
        print_dry_run(prepared.plan, common.with_previews(prepared.loaded.profile, prepared.plan, prepared.scripts),
                      as_json)
        return
    if as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    raise typer.Exit(run_plan(prepared, preflight=False, detach=not follow, announce_id=True))


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
