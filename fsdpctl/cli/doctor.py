"""``fsdpctl doctor``: check every host of a profile and diff them, before a job hangs on it."""

from __future__ import annotations

import json

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
) -> None:
    """Check every host: SSH, Python, torch/CUDA/NCCL parity, GPUs, interface, InfiniBand, ports, disk."""
    from ..connect import close_all, master_of, node_python, open_transports
    from ..doctor import make_jobs, run_doctor
    from ..plan import auto_port
    from ..profiles import load_profile
    from ..runs import new_run_id

    loaded = load_profile(profile)
    prof = loaded.profile
    if prof.backend == "slurm":
        from ..errors import UsageError

        raise UsageError(f"profile {prof.name}: doctor for Slurm profiles is not available in this version",
                         "run doctor on an ssh profile listing the same nodes")
    transports = open_transports(prof)
    master_rank, master_addr = master_of(prof)
    port = prof.rendezvous.port if isinstance(prof.rendezvous.port, int) else auto_port(new_run_id(prof.name))
    port_check = prof.backend == "ssh" and not no_port_check
    jobs = make_jobs(prof, transports, master_rank, master_addr, port, deep, port_check)
    nproc = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else None
    typer.echo(f"doctor: probing {len(jobs)} host(s) of {prof.name}", err=True)
    try:
        report = run_doctor(prof, jobs, python=node_python(prof), timeout=timeout, nproc=nproc,
                            concurrency=concurrency, on_host=progress)
    finally:
        close_all(transports)
    if as_json:
        typer.echo(json.dumps(report.to_json(strict), indent=2))
    else:
        print_report(report, strict)
    raise typer.Exit(0 if report.ok(strict) else 1)
