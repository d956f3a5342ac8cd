"""``fsdpctl doctor``: check every host of a profile and diff them, before a job hangs on it."""

from __future__ import annotations

import json
import sys

import typer

from . import common

_MARK = {"pass": ("ok", "green"), "warn": ("WARN", "yellow"), "fail": ("FAIL", "red")}


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
    from ..doctor import make_jobs, run_doctor
    from ..profiles import load_profile

    loaded = load_profile(profile)
    prof = loaded.profile
    if prof.backend == "slurm":
        from ..errors import UsageError

        raise UsageError(f"profile {prof.name}: doctor for Slurm profiles is not available in this version",
                         "run doctor on an ssh profile listing the same nodes")
    transports, python, master_rank, master_addr = _transports(prof)
    port_check = prof.backend == "ssh" and not no_port_check
    jobs = make_jobs(prof, transports, master_rank, master_addr, prof.rendezvous.port, deep, port_check)
    nproc = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else None
    typer.echo(f"doctor: probing {len(jobs)} host(s) of {prof.name}", err=True)
    report = run_doctor(prof, jobs, python=python, timeout=timeout, nproc=nproc, concurrency=concurrency,
                        on_host=_progress)
    if as_json:
        typer.echo(json.dumps(report.to_json(strict), indent=2))
    else:
        _print_report(report, strict)
    raise typer.Exit(0 if report.ok(strict) else 1)


def _transports(prof):
    if prof.backend == "local":
        from ..transport import LocalTransport

        return [LocalTransport()], prof.python or sys.executable, 0, "127.0.0.1"
    from ..ssh import SSHTransport

    transports = [SSHTransport(h, prof.ssh) for h in prof.hosts]
    names = [h.host for h in prof.hosts]
    master_rank = names.index(prof.rendezvous.host) if prof.rendezvous.host else 0
    master = prof.hosts[master_rank]
    return transports, prof.python or "python3", master_rank, master.address or master.host


def _progress(report) -> None:
    word, colour = _MARK[report.status]
    typer.echo(f"  {report.host}: {typer.style(word, fg=colour)} ({report.seconds:.2f} s)", err=True)


def _print_report(report, strict: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    names: list[str] = []
    for host in report.hosts:
        for check in host.checks:
            if check.name not in names:
                names.append(check.name)
    table = Table(title=f"fsdpctl doctor: {report.profile}")
    table.add_column("host")
    for name in names:
        table.add_column(name, justify="center")
    for host in report.hosts:
        by_name: dict[str, str] = {}
        for check in host.checks:
            if by_name.get(check.name) != "fail":
                by_name[check.name] = check.status
        cells = []
        for name in names:
            status = by_name.get(name)
            word, colour = _MARK[status] if status else ("-", "dim")
            cells.append(f"[{colour}]{word}[/]")
        table.add_row(host.host, *cells)
    console.print(table)
    if report.parity:
        parity = Table(title="parity across hosts")
        for column in ("fact", "status", "detail"):
            parity.add_column(column)
        for entry in report.parity:
            word, colour = _MARK[entry.status]
            parity.add_row(entry.fact, f"[{colour}]{word}[/]", entry.detail)
        console.print(parity)
    problems = [(h.host, c) for h in report.hosts for c in h.checks if c.status != "pass"]
    problems += [("all hosts", p) for p in report.parity if p.status != "pass"]
    for host, item in problems:
        word, colour = _MARK[item.status]
        name = getattr(item, "name", None) or getattr(item, "fact", "")
        console.print(f"[{colour}]{word}[/] {host} {name}: {item.detail}", highlight=False)
        if item.hint:
            console.print(f"     hint: {item.hint}", highlight=False)
    verdict = report.status(strict)
    word, colour = _MARK[verdict]
    console.print(f"[{colour}]{word}[/]: {len(report.hosts)} host(s) in {report.seconds:.2f} s", highlight=False)
