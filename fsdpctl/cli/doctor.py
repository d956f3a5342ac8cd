"""``fsdpctl doctor``: check every host of a profile and diff them, before a job hangs on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

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
    requirements: Optional[Path] = typer.Option(None, "--requirements", help="Also check this requirements.txt "
                                                "on every node: installed, matching, the same versions everywhere."),
) -> None:
    """Check every host: SSH, Python, torch/CUDA/NCCL parity, GPUs, interface, InfiniBand, ports, disk.

    For a Slurm profile: the controller and partition, then the same checks on allocated nodes (srun)."""
    from ..backends import backend_for
    from ..backends.base import DoctorRequest
    from ..doctor.requirements import read_requirements
    from ..plan.make import auto_port
    from ..profiles.loader import load_profile
    from ..runs.paths import new_run_id
    from ..workload import REQUIREMENTS

    loaded = load_profile(profile)
    prof = loaded.profile
    port = prof.rendezvous.port if isinstance(prof.rendezvous.port, int) else auto_port(new_run_id(prof.name))
    nproc = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else None
    request = DoctorRequest(port=port, deep=deep, timeout=timeout, concurrency=concurrency,
                            port_check=not no_port_check, nproc=nproc,
                            requirements=(*REQUIREMENTS, *(read_requirements(requirements) if requirements else ())))
    backend = backend_for(prof)
    typer.echo(f"doctor: checking the nodes of {prof.name} ({backend.name})", err=True)
    try:
        report = backend.doctor(request, on_host=progress)
        result = report.to_json(strict)
        if collectives:
            if report.ok():
                result["collectives"] = _collectives(profile, backend)
            else:
                result["collectives"] = {"skipped": "the checks above failed"}
    finally:
        backend.close()
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        print_report(report, strict)
        if collectives:
            _print_collectives(result["collectives"])
    failed = collectives and "results" not in result["collectives"]
    raise typer.Exit(0 if report.ok(strict) and not failed else 1)


def _collectives(profile_name: str, backend) -> dict:
    """Run the collective smoke test through the launch path, as a run of its own; its figures (or why not)."""
    from ..bundle import Payload, node_payload
    from ..doctor.collectives import COLLECTIVES_ENV, COLLECTIVES_MODULE, collectives_result
    from ..plan.render import render_all
    from ..plan.types import Overrides
    from ..runs.record import create_run

    device = "cpu" if backend.profile.device == "cpu" else backend.profile.device
    overrides = Overrides(entry_module=COLLECTIVES_MODULE, entry_args=("--device", device),
                          extra_env=COLLECTIVES_ENV)
    loaded, plan = common.build_plan(profile_name, overrides, for_slurm=backend.queued)
    scripts = render_all(plan)
    lines: list[str] = []
    typer.echo(f"doctor: collective smoke test as run {plan.run_id}", err=True)
    run = create_run(plan, loaded.profile, scripts, loaded.path.read_text(encoding="utf-8"))
    backend.start(run, Payload(node_payload(scripts)), detached=False)
    outcome = backend.follow(run, lambda rank, host, line: lines.append(line), owner=True)
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
