"""``fsdpctl doctor``: check every host of a profile and diff them, before a job hangs on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from .options import ProfileOpt


def doctor(
    profile: str = ProfileOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON (schema: docs/doctor.md)."),
    deep: bool = typer.Option(False, "--deep", help="Also import torch on every host (device count, NCCL's own "
                                                     "version); slower."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
    concurrency: int = typer.Option(1024, "--concurrency", min=1, help="Hosts probed at once (every host, up to "
                                    "1024: the rendezvous port check wants them all within its window)."),
    timeout: float = typer.Option(20.0, "--timeout", min=1.0, help="Seconds a host's probe may take once "
                                                                  "connected (after ssh.connect_timeout); never "
                                                                  "less than 20 s + 0.5 s per host."),
    no_port_check: bool = typer.Option(False, "--no-port-check", help="Skip the rendezvous port check."),
    collectives: bool = typer.Option(False, "--collectives", help="Then, through the launch path, time "
                                     "all-reduce and all-gather over every node (bus bandwidth per size)."),
    requirements: Optional[Path] = typer.Option(None, "--requirements", help="Also check this requirements.txt "
                                                "on every node: installed, matching, the same versions everywhere."),
    health: bool = typer.Option(False, "--health", help="Check the hardware in full: every GPU's ECC errors, row "
                                "remaps, clock slowdowns, power and PCIe limits, compute mode, heat; XID errors in "
                                "the kernel log; dcgmi diag -r 1 where DCGM is installed; InfiniBand error counters."),
    allow_busy_gpus: Optional[bool] = typer.Option(None, "--allow-busy-gpus/--no-allow-busy-gpus",
                                                   help="Another process on a GPU only warns (default: the "
                                                        "profile's health.allow_busy_gpus)."),
    exclude_unhealthy: bool = typer.Option(False, "--exclude-unhealthy", help="Exclude every host with a hardware "
                                           "fault from the profile's runs (a spare takes its place; `fsdpctl "
                                           "hosts --restore HOST` puts it back)."),
    compute: bool = typer.Option(False, "--compute", help="Then, through the launch path, time a matmul on every "
                                 "rank at once and name the ranks and nodes below 0.8x the median."),
    links: bool = typer.Option(False, "--links", help="Then, through the launch path, measure every pair of nodes "
                               "(rounds of disjoint pairs at once) and name the slow link."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="With --links: also draw the link matrix as "
                                        "DIR/links.png (needs matplotlib)."),
    container: Optional[str] = typer.Option(None, "--container", metavar="IMAGE", help="Probe inside this image "
                                            "on every node (over the profile's container.image): the runtime, the "
                                            "image's digest on every node, its Python, torch, CUDA and NCCL."),
) -> None:
    """Check every host: SSH, Python, torch/CUDA/NCCL parity, GPUs and their faults, interface,
    InfiniBand, ports, disk; with --health the hardware in full, with --compute and --links measured.

    For a Slurm profile: the controller and partition, then the same checks on allocated nodes (srun)."""
    import fsdpctl

    from .doctor_table import print_report
    from .events import EventPrinter

    if plot is not None and not links:
        raise UsageError("--plot: it draws the link matrix", "add --links, or drop --plot")
    loaded = fsdpctl.load_profile(profile)
    typer.echo(f"doctor: checking the nodes of {loaded.name} ({loaded.profile.backend})", err=True)
    report = fsdpctl.doctor(loaded, deep=deep, timeout=timeout, concurrency=concurrency,
                            port_check=not no_port_check, requirements=requirements, collectives=collectives,
                            health=health, allow_busy_gpus=allow_busy_gpus, exclude_unhealthy=exclude_unhealthy,
                            compute=compute, links=links, container=container,
                            on_event=EventPrinter(quiet_progress=True))
    if plot is not None and "pairs" in (report.links or {}):
        from ..hostcheck.links import plot_matrix

        report.links["plot"] = str(plot_matrix(report.links, plot))
    if as_json:
        typer.echo(json.dumps(report.to_json(strict), indent=2))
    else:
        print_report(report, strict)
        if collectives:
            _print_collectives(report.collectives or {})
        if compute:
            _print_measured("compute", report.compute or {}, "ranks")
        if links:
            _print_measured("links", report.links or {}, "pairs")
    failed = [name for name, wanted, key in (("collectives", collectives, "results"), ("compute", compute, "ranks"),
                                             ("links", links, "pairs"))
              if wanted and key not in (getattr(report, name) or {})]
    raise typer.Exit(0 if report.passes(strict) and not failed else 1)


def _print_measured(name: str, data: dict, key: str) -> None:
    """The compute table or the link matrix, then the verdict's lines."""
    if key not in data:
        typer.secho(f"{name}: {data.get('skipped') or data.get('error')}", fg="red")
        for line in data.get("last_lines", []):
            typer.echo(f"  {line}")
        return
    if name == "compute":
        from ..hostcheck.compute import table_lines

        typer.echo(f"compute: {data['dtype']} matmul {data['size']}x{data['size']} on {data['device']}, "
                   f"{data['seconds']} s per rank (run {data['run_id']})")
        shown = table_lines(data)
    else:
        from ..hostcheck.links import matrix_lines

        typer.echo(f"links: {data['backend']}, {len(data['nodes'])} node(s), {len(data['pairs'])} pair(s) in "
                   f"{data['rounds']} round(s), {data['seconds']:.1f} s (run {data['run_id']}); GB/s each way")
        shown = matrix_lines(data)
    for line in [*shown, *data.get("verdict", [])]:
        typer.echo(f"  {line}")
    if data.get("plot"):
        typer.echo(f"  figure: {data['plot']}")


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
