"""``fsdpctl status``, ``stop`` and ``runs``: what runs exist, how each one stands, and ending one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Optional

import typer

from .complete import run_completion

if TYPE_CHECKING:
    import fsdpctl


def status(
    run_id: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix); default: the latest run.",
                                          autocompletion=run_completion),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
    timings: bool = typer.Option(False, "--timings", help="Where the launch's seconds went: every phase of it "
                                 "(connect, probe, staging, the agents, torchrun, the rendezvous, the first step, "
                                 "the end), when the slowest node was done, and which node that was."),
    attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="With --timings: an earlier attempt's."),
) -> None:
    """Per node: running, succeeded or failed, exit codes, its GPUs now (clocks, slowdowns, heat), and
    the last step and loss; the straggler, with its cause when its GPU's samples show one."""
    import fsdpctl
    from fsdpctl.metrics.gpu_samples import gpu_cause, latest_by_node, now_text
    from fsdpctl.rundir.status import attempt_changes

    if timings:
        print_timings(run_id, attempt, as_json)
        return
    with fsdpctl.get_run(run_id) as run:
        info = run.status()
        counted = goodput_here(run)
    if as_json:
        typer.echo(json.dumps({**info.to_json(), "goodput": counted.to_json() if counted else None}, indent=2))
        return
    last = info.last_metrics or {}
    progress = f"; last step {last.get('step')} loss {loss_text(last.get('loss'))}" if last else ""
    which = ""
    if info.attempt > 1:
        start = f" from step {info.from_step}" if info.from_step is not None else ""
        which = f" (attempt {info.attempt}{start})"
    saved = f" after its checkpoint of step {info.stop_checkpoint}" if info.stop_checkpoint is not None else ""
    typer.echo(f"{info.run_id}: {info.state}{saved}{which}{progress}")
    if counted is not None:
        from fsdpctl.accounting.render import one_line

        typer.echo(f"  {one_line(counted)}")
    for earlier in info.attempts:
        start = f" from step {earlier.from_step}" if earlier.from_step is not None else ""
        ended = f": {earlier.ended_by}" if earlier.ended_by else ""
        code = "" if earlier.exit_code is None else f" (exit {earlier.exit_code})"
        changes = attempt_changes(earlier.replacements, earlier.recovery, earlier.resize)
        changes = f"; {changes}" if changes else ""
        typer.echo(f"  attempt {earlier.attempt}{start}: {earlier.state}{code}{ended}{changes}")
        if earlier.restart:
            typer.echo(f"    {restart_text(earlier.restart)}")
    if info.replacements or info.recovery or info.resize:
        typer.echo(f"  attempt {info.attempt}: {attempt_changes(info.replacements, info.recovery, info.resize)}")
    if info.restart:
        typer.echo(f"  attempt {info.attempt}: {restart_text(info.restart)}")
    for note in info.notes:
        typer.echo(f"  note: {note}")
    latest = latest_by_node(info.gpu_samples)
    for node in info.nodes:
        code = "" if node.exit_code is None else f" (exit {node.exit_code})"
        ranks = "" if not node.ranks else f" (global rank{'s' if '-' in node.ranks else ''} {node.ranks})"
        typer.echo(f"  node {node.node_rank} {node.host}{ranks}: {node.state}{code}")
        if node.node_rank in latest:
            typer.echo(f"    GPUs: {now_text(latest[node.node_rank])}")
    failure = info.first_failure
    if failure is not None and failure.kind == "hang":
        typer.echo(f"  {failure.headline()}")
        typer.echo(f"  stacks and flight-recorder dumps in {failure.hang_dir}")
    elif failure is not None:
        typer.echo(f"  first failure: {failure.headline()}")
    if last.get("straggler"):
        typer.echo(f"  {last['straggler']}")
        where = last.get("straggler_at") or {}
        cause = gpu_cause(info.gpu_samples, str(where.get("host")), where.get("local_ranks") or []) if where else None
        if cause:
            typer.echo(f"  cause, from its GPU's samples: {cause}")


def goodput_here(run: object) -> Optional[object]:
    """The run's goodput account from the files here (no node is asked); None where it has none or it
    cannot be counted (the status stands without it)."""
    try:
        return run.goodput(fetch=False)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the status is what was asked for
        return None


def restart_text(verdict: Mapping[str, Any]) -> str:
    """run.json's ``restart`` of an attempt in a line: "restarted for a lost node (...)", "not restarted: ..."."""
    why = str(verdict.get("why") or verdict.get("cause") or "")
    return f"restarted for {why}" if verdict.get("restarted") else why


def print_timings(run_id: Optional[str], attempt: Optional[int], as_json: bool) -> None:
    """``status --timings``: the attempt's timeline, from run.json (no node is asked)."""
    import fsdpctl
    from fsdpctl.rundir.timeline import render

    with fsdpctl.get_run(run_id) as run:
        rows = run.timeline(attempt)
        which = attempt or run.attempt
        hosts = {str(n.node_rank): n.host for n in run.plan.nodes}
        if as_json:
            typer.echo(json.dumps({"run_id": run.run_id, "attempt": which, "timeline": rows}, indent=2))
            return
        typer.echo(f"{run.run_id}: attempt {which}, seconds after the launch began")
        for line in render(rows, hosts):
            typer.echo(f"  {line}")


def loss_text(loss: object) -> str:
    """A loss as the workload prints it (``loss=7.3845``: four decimals); anything else as it is."""
    return f"{loss:.4f}" if isinstance(loss, (int, float)) and not isinstance(loss, bool) else str(loss)


def stop(
    run_id: str = typer.Argument(..., help="Run id (or a unique prefix).", autocompletion=run_completion),
    grace: Optional[int] = typer.Option(None, "--grace", min=0, max=86400, help="Seconds every rank has to save and "
                                        "exit by itself after the stop signal, before what is left is killed "
                                        "(default: the profile's stop_grace, 10)."),
    stop_signal: Optional[str] = typer.Option(None, "--signal", help="The signal every rank gets first: TERM, INT, HUP "
                                              "or USR1 (default: the profile's stop_signal, TERM)."),
) -> None:
    """End every process of a run on every node: the stop signal to every rank at once, the grace for
    them to save and exit, then TERM and KILL. The bundled workload saves a checkpoint on it."""
    import fsdpctl

    with fsdpctl.get_run(run_id) as run:
        remaining = run.stop(grace, stop_signal)
        saved = run.status().stop_checkpoint
    left = {host: pids for host, pids in remaining.items() if pids}
    for host, pids in remaining.items():
        typer.echo(f"  {host}: {'stopped' if not pids else 'LEFT: ' + pids}", err=True)
    after = f" after its checkpoint of step {saved}" if saved is not None else ""
    typer.echo(f"fsdpctl: run {run.run_id} stopped{after}" if not left else f"fsdpctl: run {run.run_id}: "
               f"processes remain on {', '.join(left)}", err=True)
    raise typer.Exit(1 if left else 0)


RUNS_HEADER = ("RUN ID", "STATE", "BACKEND", "NODES", "STARTED", "DURATION", "EXIT", "ATTEMPT")


def runs(
    as_json: bool = typer.Option(False, "--json", help="Print the runs as a JSON list of objects."),
) -> None:
    """The run registry: every run in the runs directory, oldest first, with its state (a scheduler's
    live jobs asked once for all), backend, nodes, start (local time), duration, exit code and attempt."""
    import fsdpctl

    now = datetime.now().astimezone()
    infos = [run.info for run in fsdpctl.runs()]
    if as_json:
        typer.echo(json.dumps([info.to_json(now) for info in infos], indent=2))
        return
    if not infos:
        from fsdpctl.rundir.paths import runs_root

        typer.echo(f"fsdpctl: no runs in {runs_root()}", err=True)
        return
    rows = [RUNS_HEADER, *(_runs_row(info, now) for info in infos)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(RUNS_HEADER))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _runs_row(info: fsdpctl.RunInfo, now: datetime) -> tuple[str, ...]:
    """One run's row of ``fsdpctl runs`` ("-": not recorded)."""
    duration = info.duration_s(now)
    return (info.run_id, str(info.state), info.backend, str(info.num_nodes or "?"), _local_time(info.started_at),
            "-" if duration is None else duration_text(duration),
            "-" if info.exit_code is None else str(info.exit_code), str(info.attempt))


def _local_time(text: Optional[str]) -> str:
    """A time run.json recorded, in this machine's time zone, to the minute ("-": none)."""
    try:
        return datetime.fromisoformat(text).astimezone().strftime("%Y-%m-%d %H:%M") if text else "-"
    except ValueError:
        return "-"


def duration_text(seconds: float) -> str:
    """A duration the way a person reads it: ``40s``, ``5m07s``, ``1h02m``, ``2d03h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
