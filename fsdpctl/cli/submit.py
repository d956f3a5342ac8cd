"""``fsdpctl submit --slurm``: the same job as a Slurm batch script."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import UsageError
from .options import CLUSTER, JOB, RUN, WORKLOAD, Flags, with_options


@with_options(JOB, WORKLOAD, CLUSTER, RUN)
def submit(
    flags: Flags,
    slurm: bool = typer.Option(False, "--slurm", help="Submit through Slurm (the only scheduler so far)."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="Nodes to allocate (overrides slurm.nodes)."),
    time: Optional[str] = typer.Option(None, "--time", help="Time limit, e.g. 02:00:00 (overrides slurm.time)."),
    partition: Optional[str] = typer.Option(None, "--partition", help="Partition (overrides slurm.partition)."),
    via: Optional[str] = typer.Option(None, "--via", help="sbatch (fsdpctl's batch script) or submitit "
                                      "(overrides slurm.via)."),
    requeue: Optional[bool] = typer.Option(None, "--requeue/--no-requeue", help="Checkpoint on SIGUSR2 before the "
                                           "time limit and requeue; resume when requeued (overrides slurm.requeue)."),
    spares: Optional[int] = typer.Option(None, "--spares", help="Spare nodes the job holds: when a node fails, "
                                         "the next step runs on a spare in its place (overrides slurm.spares)."),
    min_nodes: Optional[int] = typer.Option(None, "--min-nodes", min=0, help="When a node fails and no spare is left, "
                                            "the next step runs on the healthy nodes if at least this many remain, "
                                            "keeping the bundled workload's global batch (overrides "
                                            "elastic.min_nodes; 0: end the job)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow the job's logs until it ends."),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="Show a line several ranks print alike once, "
                               "with the ranks that said it ([r0-7], [all 16 ranks]); the nodes' files keep every "
                               "line."),
    top: bool = typer.Option(False, "--top", help="With --follow: watch the job in `fsdpctl top`'s live view once "
                             "it is submitted (q leaves the view; the job goes on, its lines follow here)."),
) -> None:
    """Submit your program (after --) or the bundled FSDP/FSDP2 GPT training as a Slurm job (sbatch or
    submitit). The run directory, your code included, goes once to storage every node shares."""
    import fsdpctl

    from ..rundir.timeline import note_process_start
    from .events import EventPrinter, exit_code_of, folder_if
    from .show import print_dry_run
    from .top import watching

    note_process_start()  # the launch's timeline begins with this process
    if not slurm:
        raise UsageError("submit needs a scheduler", "add --slurm")
    if top and not follow:
        raise UsageError("--top: shows the job while this command follows it", "add --follow, or watch it later "
                         "with `fsdpctl top RUN_ID`")
    slurm_options = {"nodes": nodes, "time": time, "partition": partition, "via": via, "requeue": requeue,
                     "spares": spares}
    if flags.resume is not None:
        flags.refuse_with_resume(**slurm_options, min_nodes=min_nodes)
        run = fsdpctl.get_run(flags.resume)  # continued through the backend it ran with
        printer = EventPrinter(total_steps=flags.steps or run.plan.train.get("steps"), run_id_on_stdout=True,
                               folder=folder_if(dedup))
        with watching(printer, top) as handler:
            run.resume(steps=flags.steps, epochs=flags.epochs, detach=not follow, hang_timeout=flags.hang_timeout,
                       on_hang=flags.on_hang, on_event=handler, handle_signals=True)
        raise typer.Exit(exit_code_of(printer))
    options = flags.job_options(**slurm_options, min_nodes=min_nodes)
    if flags.dry_run:
        prepared = fsdpctl.prepare(flags.profile, options=options, slurm=True)
        print_dry_run(prepared.plan, prepared.previews(), flags.as_json, prepared.warnings)
        return
    if flags.as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    printer = EventPrinter(total_steps=options.workload.get("steps"), run_id_on_stdout=True,
                               folder=folder_if(dedup))
    with watching(printer, top) as handler:
        fsdpctl.submit(flags.profile, options=options, follow=follow, on_event=handler, handle_signals=True)
    raise typer.Exit(exit_code_of(printer))
