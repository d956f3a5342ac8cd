"""``fsdpctl launch``: run your program, or the bundled workload, on every node of a profile."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import UsageError
from .complete import hosts as host_completion
from .options import CLUSTER, JOB, RUN, WORKLOAD, Flags, with_options


@with_options(JOB, WORKLOAD, CLUSTER, RUN)
def launch(
    flags: Flags,
    detach: bool = typer.Option(False, "--detach", help="Start the run and return; it outlives this command "
                                "(no node timeout). Follow it with `fsdpctl logs -f`, end it with `fsdpctl stop`."),
    no_preflight: bool = typer.Option(False, "--no-preflight", help="Skip doctor's checks before starting."),
    fetch: Optional[list[str]] = typer.Option(None, "--fetch", help="When the run ends, copy this file or folder "
                                              "(under $FSDPCTL_RUN_DIR) back from every node (repeatable)."),
    node_timeout: Optional[int] = typer.Option(None, "--node-timeout", min=3, help="Seconds the launcher and a "
                                               "node may hear nothing from each other before the node is lost and "
                                               "stops its own ranks (default: the profile's node_timeout, 30). A "
                                               "--detach run outlives its launcher; its follower in the "
                                               "background takes a node silent this long as lost."),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", min=0, max=100, help="When a rank or node "
                                               "fails (or the run hangs), tear down, re-check the nodes and start "
                                               "again from the newest complete checkpoint, up to N times (default: "
                                               "the profile's max_restarts, 0). A --detach run's follower in the "
                                               "background restarts it."),
    exclude: Optional[list[str]] = typer.Option(None, "--exclude", autocompletion=host_completion,
                                                help="Leave this host of the profile out of "
                                                "this launch; a spare takes its place. HOST:3 leaves out one GPU "
                                                "of it (repeatable)."),
    min_nodes: Optional[int] = typer.Option(None, "--min-nodes", min=0, help="Elastic: when a node is to blame and no "
                                            "spare is left, go on with the nodes left, down to N (the bundled "
                                            "workload keeps its global batch); grow back when the host is "
                                            "restored. Default: the profile's elastic.min_nodes; 0: off."),
    allow_busy_gpus: Optional[bool] = typer.Option(None, "--allow-busy-gpus/--no-allow-busy-gpus", help="Start even "
                                                   "when other processes already use a GPU (the preflight then "
                                                   "only warns; default: the profile's health.allow_busy_gpus)."),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="Show a line several ranks print alike once, "
                               "with the ranks that said it ([r0-7], [all 16 ranks]); the nodes' files keep every "
                               "line."),
    top: bool = typer.Option(False, "--top", help="Watch the run in `fsdpctl top`'s live view once it has started "
                             "(q leaves the view; the run goes on, its lines follow here)."),
    profile_steps: Optional[str] = typer.Option(None, "--profile-steps", metavar="A-B", help="Record steps A to B "
                                                "(A >= 2) with torch.profiler on --profile-ranks; when the run "
                                                "ends, the traces come back merged (as `fsdpctl profile`)."),
    profile_ranks: str = typer.Option("auto", "--profile-ranks", help="With --profile-steps: all, a list (0,3), or "
                                      "auto (every rank up to 8, else the first, middle and last)."),
) -> None:
    """Start your program (after --) or the bundled FSDP/FSDP2 GPT training on every node of PROFILE.

    \b
    fsdpctl launch -p two-node -- train.py --epochs 3
    fsdpctl launch -p two-node --code ~/proj --env WANDB_PROJECT=demo -- -m proj.train --lr 3e-4
    fsdpctl launch --job nightly          (./jobs/nightly.yaml: command, code, env, requirements)
    fsdpctl launch -p two-node            (the bundled GPT: checks the cluster end to end)"""
    import fsdpctl

    from ..rundir.timeline import note_process_start
    from .events import EventPrinter, exit_code_of, folder_if
    from .show import print_dry_run
    from .top import watching

    note_process_start()  # the launch's timeline begins with this process
    if flags.resume is not None:
        flags.refuse_with_resume(exclude=exclude, allow_busy_gpus=allow_busy_gpus, min_nodes=min_nodes)
        run = fsdpctl.get_run(flags.resume)  # continued through the backend it ran with
        printer = EventPrinter(total_steps=flags.steps or run.plan.train.get("steps"), folder=folder_if(dedup))
        with watching(printer, top) as handler:
            run.resume(steps=flags.steps, epochs=flags.epochs, detach=detach, preflight=not no_preflight,
                       fetch=tuple(fetch or ()), node_timeout=node_timeout, hang_timeout=flags.hang_timeout,
                       on_hang=flags.on_hang, max_restarts=max_restarts, on_event=handler, handle_signals=True)
        raise typer.Exit(exit_code_of(printer))
    if profile_steps is not None:
        flags.values["env"] = [*(flags.values.get("env") or ()), *profile_env_items(profile_steps, profile_ranks)]
    options = flags.job_options(node_timeout=node_timeout, max_restarts=max_restarts, exclude=tuple(exclude or ()),
                                allow_busy_gpus=allow_busy_gpus, min_nodes=min_nodes)
    if flags.dry_run:
        prepared = fsdpctl.prepare(flags.profile, options=options)
        print_dry_run(prepared.plan, prepared.previews(), flags.as_json, prepared.warnings)
        return
    if flags.as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    printer = EventPrinter(total_steps=options.workload.get("steps"), folder=folder_if(dedup))
    with watching(printer, top) as handler:
        run = fsdpctl.launch(flags.profile, options=options, detach=detach, preflight=not no_preflight,
                             fetch=tuple(fetch or ()), on_event=handler, handle_signals=True)
    if profile_steps is not None and not detach:
        from ..api.tracing import gather_launched

        traced = gather_launched(run)
        if traced is not None:
            typer.echo("\n".join(traced.lines()))
    raise typer.Exit(exit_code_of(printer))


def profile_env_items(steps: str, ranks: str) -> list[str]:
    """``--profile-steps A-B`` and ``--profile-ranks`` as the ranks' variables (``fsdpctl.node.profiling``)."""
    first, _, last = steps.partition("-")
    if not (first.isdigit() and (last or first).isdigit()) or not 2 <= int(first) <= int(last or first) \
            or int(last or first) - int(first) >= 100:
        raise UsageError(f"--profile-steps: {steps!r} is not A-B with 2 <= A <= B and at most 100 steps",
                         "give e.g. --profile-steps 10-12 (step 1 holds the start-up)")
    spec = ranks.strip()
    if spec not in ("all", "auto") and not all(p.strip().isdigit() for p in spec.split(",")):
        raise UsageError(f"--profile-ranks: {ranks!r} is not all, auto or a list of ranks", "give e.g. 0,3")
    from ..node.profiling import RANKS_VARIABLE, STEPS_VARIABLE

    return [f"{STEPS_VARIABLE}={int(first)}-{int(last or first)}", f"{RANKS_VARIABLE}={spec}"]

