"""``fsdpctl init``: write a cluster profile from the hosts themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def init(
    name: str = typer.Argument(..., help="The profile's name (cluster_profiles/NAME.yaml)."),
    hosts: Optional[list[str]] = typer.Argument(None, help="Hosts: names, addresses or ~/.ssh/config aliases."),
    hostfile: Optional[Path] = typer.Option(None, "--hostfile", help="A DeepSpeed/MPI hostfile: `host slots=N`, "
                                            "`host:N` or `host` per line."),
    slurm: bool = typer.Option(False, "--slurm", help="The nodes of a Slurm allocation, probed through srun."),
    nodelist: Optional[str] = typer.Option(None, "--nodelist", help="With --slurm: which nodes (gpu[01-04]); "
                                           "default: this allocation's."),
    partition: Optional[str] = typer.Option(None, "--partition", help="With --slurm: the partition."),
    master: Optional[str] = typer.Option(None, "--master", help="The host the others rendezvous at (default: "
                                         "the first)."),
    python: Optional[str] = typer.Option(None, "--python", help="The Python with torch on the nodes (default: "
                                         "found on each: the login shell's python3, venvs, conda)."),
    ib: str = typer.Option("auto", "--ib", metavar="auto|on|off", help="InfiniBand: auto (used when every host "
                           "has a port up), on (required), off."),
    user: Optional[str] = typer.Option(None, "--user", help="SSH user."),
    port: Optional[int] = typer.Option(None, "--port", help="SSH port."),
    identity_file: Optional[str] = typer.Option(None, "--identity-file", help="SSH private key."),
    known_hosts: Optional[str] = typer.Option(None, "--known-hosts", help="known_hosts file for the hosts' keys."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Where runs go on the nodes (default ~/fsdpctl; "
                                          "for Slurm, storage every node shares)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to write it (default: "
                                          "cluster_profiles/NAME.yaml)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing file."),
    timeout: float = typer.Option(20.0, "--timeout", min=1.0, help="Seconds a host's probe may take."),
) -> None:
    """Write a cluster profile from what every host reports: the card that routes to the master (and
    what NCCL would pick on its own), InfiniBand/RoCE, NCCL plugins, GPUs, the Python with torch.
    Shows where the hosts disagree; refuses what cannot be one profile value, naming the hosts."""
    import fsdpctl

    from ..api.init import InitRefused
    from .events import EventPrinter, say

    say(f"init: probing {'the Slurm nodes' if slurm else f'{len(hosts or [])} host(s)'}"
        + (f" and {hostfile}" if hostfile else ""))
    try:
        result = fsdpctl.init_profile(name, tuple(hosts or ()), hostfile=hostfile, slurm=slurm, nodelist=nodelist,
                                      partition=partition, master=master, python=python, ib=ib,  # type: ignore
                                      user=user, port=port, identity_file=identity_file, known_hosts=known_hosts,
                                      workdir=workdir, output=output, force=force, timeout=timeout,
                                      on_event=EventPrinter(quiet_progress=True))
    except InitRefused as refused:
        print_rows(refused.rows)
        for why in refused.refusals:
            typer.secho(f"REFUSED {why}", fg="red", err=True)
        raise
    print_rows(result.rows)
    for warning in result.warnings:
        typer.secho(f"WARN {warning}", fg="yellow", err=True)
    typer.echo(result.text, nl=False)
    say(f"wrote {result.path} ({len(result.findings)} host(s), {result.seconds:.1f} s); check it with "
        f"`fsdpctl doctor -p {result.name}`", "green")


def print_rows(rows) -> None:
    """The facts x hosts table: where the hosts agree, and where not."""
    if not rows:
        return
    from rich.console import Console
    from rich.table import Table

    hosts = list(rows[0].values)
    table = Table(title="what the hosts report")
    for column in ("fact", *hosts, ""):
        table.add_column(column)
    marks = {"ok": "[green]same[/]", "differs": "[yellow]DIFFERS[/]", "fails": "[red]DIFFERS: doctor fails[/]",
             "refused": "[red]REFUSED[/]"}
    for row in rows:
        table.add_row(row.fact, *(row.values.get(h, "-") for h in hosts),
                      marks[row.status] + (f" ({row.note})" if row.note else ""))
    import sys

    # Into a pipe or file: wide enough that no value is cut.
    Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 220).print(table)
