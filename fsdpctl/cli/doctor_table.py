"""How doctor reports are shown: progress lines while hosts answer, then a table, parity and hints."""

from __future__ import annotations

import sys

import typer

_SLURM_CHECKS = ("controller", "partition", "allocation")
_MARK = {"pass": ("ok", "green"), "warn": ("WARN", "yellow"), "fail": ("FAIL", "red")}


def progress(report) -> None:
    """One line on stderr as each host's verdict arrives."""
    word, colour = _MARK[report.status]
    typer.echo(f"  {report.host}: {typer.style(word, fg=colour)} ({report.seconds:.2f} s)", err=True)


def print_report(report, strict: bool = False) -> None:
    """The hosts x checks table, the parity table, every problem with its hint, and the verdict."""
    from rich.console import Console

    # Into a pipe or file: no wrapping at 80 columns, so a hint stays one line to copy.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    for check in report.cluster:
        word, colour = _MARK[check.status]
        scope = "slurm " if check.name in _SLURM_CHECKS else ""
        console.print(f"[{colour}]{word}[/] {scope}{check.name}: {check.detail}", highlight=False)
        if check.status != "pass" and check.hint:
            console.print(f"     hint: {check.hint}", highlight=False)
    if report.hosts:
        _print_tables(console, report)
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


def _print_tables(console, report) -> None:
    from rich.table import Table

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
