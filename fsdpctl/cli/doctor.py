"""``fsdpctl doctor``: check every host of a profile and diff them, before a job hangs on it."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from . import common
from .report import print_report, progress


def doctor(
    profile: str = common.ProfileOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (schema: docs/doctor.md)."),
    deep: bool = typer.Option(False, "--deep", help="Also import torch on every host (device count, NCCL's own "
                                                     "version); slower."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
    concurrency: int = typer.Option(32, "--concurrency", min=1, help="Hosts probed at once."),
    timeout: float = typer.Option(20.0, "--timeout", min=1.0, help="Seconds a host's probe may take once "
                                                                  "connected (after ssh.connect_timeout)."),
    no_port_check: bool = typer.Option(False, "--no-port-check", help="Skip the rendezvous port check."),
    collectives: bool = typer.Option(False, "--collectives", help="Then, through the launch path, time "
                                     "all-reduce and all-gather over every node (bus bandwidth per size)."),
) -> None:
    """Check every host: SSH, Python, torch/CUDA/NCCL parity, GPUs, interface, InfiniBand, ports, disk.

    For a Slurm profile: the controller and partition, then the same checks on allocated nodes (srun)."""
    from ..backends.connect import close_all, master_of, node_python, open_transports
    from ..doctor.fanout import make_jobs, run_doctor
    from ..plan.make import auto_port
    from ..profiles.loader import load_profile
    from ..runs.paths import new_run_id

    loaded = load_profile(profile)
    prof = loaded.profile
    port = prof.rendezvous.port if isinstance(prof.rendezvous.port, int) else auto_port(new_run_id(prof.name))
    nproc = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else None
    if prof.backend == "slurm":
        if collectives:
            from ..errors import UsageError

            raise UsageError("--collectives: not available for Slurm profiles",
                             "submit a short job instead: fsdpctl submit --slurm --steps 5 --follow")
        from ..backends.slurm.doctor import run_slurm_doctor

        typer.echo(f"doctor: asking Slurm, then probing {prof.slurm.nodes} allocated node(s) of {prof.name}",
                   err=True)
        report = run_slurm_doctor(prof, python=node_python(prof), port=port, deep=deep, timeout=timeout,
                                  nproc=nproc, on_host=progress)
    else:
        transports = open_transports(prof)
        master_rank, master_addr = master_of(prof)
        port_check = prof.backend == "ssh" and not no_port_check
        jobs = make_jobs(prof, transports, master_rank, master_addr, port, deep, port_check)
        typer.echo(f"doctor: probing {len(jobs)} host(s) of {prof.name}", err=True)
        try:
            report = run_doctor(prof, jobs, python=node_python(prof), timeout=timeout, nproc=nproc,
                                concurrency=concurrency, on_host=progress)
        finally:
            close_all(transports)
    result = report.to_json(strict)
    if collectives:
        if report.ok():
            result["collectives"] = _collectives(profile, prof)
        else:
            result["collectives"] = {"skipped": "the checks above failed"}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        print_report(report, strict)
        if collectives:
            _print_collectives(result["collectives"])
    failed = collectives and "results" not in result["collectives"]
    raise typer.Exit(0 if report.ok(strict) and not failed else 1)


def _collectives(profile_name: str, prof) -> dict:
    """Launch the collective smoke test like a training run; return its figures (or why not)."""
    from ..backends import launcher
    from ..backends.connect import close_all, open_transports
    from ..doctor.collectives import COLLECTIVES_ENV, COLLECTIVES_MODULE, collectives_result
    from ..plan.render import render_all
    from ..plan.types import Overrides
    from ..runs.paths import RunPaths
    from ..runs.record import prepare

    device = "cpu" if prof.device == "cpu" else prof.device
    overrides = Overrides(entry_module=COLLECTIVES_MODULE, entry_args=("--device", device),
                          extra_env=COLLECTIVES_ENV)
    loaded, plan = common.build_plan(profile_name, overrides, for_slurm=False)
    scripts = render_all(plan)
    paths = RunPaths(Path(plan.local_run_dir))
    lines: list[str] = []
    transports = open_transports(prof)
    typer.echo(f"doctor: collective smoke test as run {plan.run_id}", err=True)
    try:
        prepare(paths, plan, scripts, loaded.path.read_text(encoding="utf-8"))
        runs = launcher.start(paths, plan, scripts, transports, detached=False)
        outcome = launcher.supervise(paths, plan, runs, lambda rank, host, line: lines.append(line))
    finally:
        close_all(transports)
    found = collectives_result(lines)
    if outcome.exit_code or found is None:
        return {"run_id": plan.run_id, "error": f"the smoke test exited {outcome.exit_code}",
                "last_lines": lines[-15:]}
    return {"run_id": plan.run_id, **found}


def _print_collectives(data: dict) -> None:
    if "results" not in data:
        typer.secho(f"collectives: {data.get('skipped') or data.get('error')}", fg="red")
        for line in data.get("last_lines", []):
            typer.echo(f"  {line}")
        return
    typer.echo(f"collectives: backend {data['backend']}, world size {data['world_size']}, "
               f"transport {', '.join(data['transport'])} (run {data['run_id']})")
    typer.echo(f"  {'op':11s} {'size':>9s} {'time ms':>9s} {'algbw GB/s':>11s} {'busbw GB/s':>11s}")
    for row in data["results"]:
        typer.echo(f"  {row['op']:11s} {_size(row['bytes']):>9s} {row['seconds'] * 1e3:9.3f} "
                   f"{row['algbw_gbps']:11.3f} {row['busbw_gbps']:11.3f}")


def _size(count: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if count >= scale and count % scale == 0:
            return f"{count // scale}{unit}"
    return str(count)
