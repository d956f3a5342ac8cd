"""``fsdpctl doctor``: check every host of a profile and diff them, before a job hangs on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from .options import ProfileOpt


def doctor(
    profile: str = ProfileOpt,
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
    import fsdpctl

    from .doctor_table import print_report
    from .events import EventPrinter

    loaded = fsdpctl.load_profile(profile)
    typer.echo(f"doctor: checking the nodes of {loaded.name} ({loaded.profile.backend})", err=True)
    report = fsdpctl.doctor(loaded, deep=deep, timeout=timeout, concurrency=concurrency,
                            port_check=not no_port_check, requirements=requirements, collectives=collectives,
                            on_event=EventPrinter(quiet_progress=True))
    if as_json:
        typer.echo(json.dumps(report.to_json(strict), indent=2))
    else:
        print_report(report, strict)
        if collectives:
            _print_collectives(report.collectives or {})
    failed = collectives and "results" not in (report.collectives or {})
    raise typer.Exit(0 if report.passes(strict) and not failed else 1)


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
