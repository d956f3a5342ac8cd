"""``fsdpctl status``, ``stop`` and ``runs``: what runs exist, how each one stands, and ending one."""

from __future__ import annotations

import json
from typing import Optional

import typer

from .common import opened_run


def status(
    run_id: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix); default: the latest run."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Per node: running, succeeded or failed, exit codes, and the last step and loss."""
    with opened_run(run_id) as (run, backend):
        info = backend.status(run)
    record = run.record
    info.update(attempt=record.get("attempt", 1), from_step=record.get("from_step"),
                attempts=record.get("attempts", []))
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    last = info.get("last_metrics") or {}
    progress = f"; last step {last.get('step')} loss {last.get('loss')}" if last else ""
    attempt = info["attempt"]
    which = ""
    if attempt > 1:
        start = f" from step {record['from_step']}" if record.get("from_step") is not None else ""
        which = f" (attempt {attempt}{start})"
    typer.echo(f"{info['run_id']}: {info['state']}{which}{progress}")
    for earlier in record.get("attempts", []):
        start = f" from step {earlier['from_step']}" if earlier.get("from_step") is not None else ""
        ended = f": {earlier['ended_by']}" if earlier.get("ended_by") else ""
        code = "" if earlier.get("exit_code") is None else f" (exit {earlier['exit_code']})"
        typer.echo(f"  attempt {earlier['attempt']}{start}: {earlier.get('state', '?')}{code}{ended}")
    for node in info["nodes"]:
        code = "" if node.get("exit_code") is None else f" (exit {node['exit_code']})"
        typer.echo(f"  node {node['node_rank']} {node['host']}: {node['state']}{code}")
    failure = info.get("first_failure")
    if failure and failure.get("hang"):
        typer.echo(f"  hung: {failure['hang']}")
        typer.echo(f"  stacks and flight-recorder dumps in {failure.get('hang_dir')}")
    elif failure and failure.get("lost"):
        typer.echo(f"  first failure: {failure['host']} node {failure['node_rank']} was lost: {failure['lost']}")
    elif failure:
        typer.echo(f"  first failure: {failure['host']} node {failure['node_rank']} rank {failure.get('rank')} "
                   f"exit {failure['exit_code']}")


def stop(run_id: str = typer.Argument(..., help="Run id (or a unique prefix).")) -> None:
    """End every process of a run on every node (TERM, grace period, KILL)."""
    with opened_run(run_id) as (run, backend):
        remaining = backend.stop(run)
    left = {host: pids for host, pids in remaining.items() if pids}
    for host, pids in remaining.items():
        typer.echo(f"  {host}: {'stopped' if not pids else 'LEFT: ' + pids}", err=True)
    typer.echo(f"fsdpctl: run {run.run_id} stopped" if not left else f"fsdpctl: run {run.run_id}: "
               f"processes remain on {', '.join(left)}", err=True)
    raise typer.Exit(1 if left else 0)


def runs() -> None:
    """The run registry: every run in the runs directory, oldest first."""
    from ..runs.paths import list_runs, read_json

    for run_dir in list_runs():
        record = read_json(run_dir / "run.json")
        code = record.get("exit_code")
        attempts = f"\tattempt {record['attempt']}" if record.get("attempt", 1) > 1 else ""
        typer.echo(f"{run_dir.name}\t{record.get('state', '?')}\t{record.get('backend', '?')}\t"
                   f"{record.get('num_nodes', '?')} node(s)\t{'' if code is None else f'exit {code}'}{attempts}")
