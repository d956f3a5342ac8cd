"""``fsdpctl logs``: a run's output, merged and prefixed, filtered by node, rank or pattern; ``-f`` follows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError

_LINE = re.compile(r"^\[(?P<host>\S+) r(?P<node>\d+)\] (?P<text>.*)$")


def logs(
    run_id: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix); default: the latest run."),
    follow: bool = typer.Option(False, "-f", "--follow", help="Follow a running job until it ends (over SSH)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only lines of this global rank."),
    host: Optional[str] = typer.Option(None, "--host", help="Only lines of this host (as in the profile)."),
    grep: Optional[str] = typer.Option(None, "--grep", help="Only lines matching this regular expression."),
) -> None:
    """Print a run's logs, merged across nodes, each line prefixed with [host rNODE]."""
    from ..runs.paths import find_run
    from .stream import prefix

    try:
        pattern = re.compile(grep) if grep else None
    except re.error as exc:
        raise UsageError(f"--grep {grep!r}: not a regular expression ({exc})", "escape special characters") from None
    run_dir = find_run(run_id)

    def wanted(node_host: str, text: str) -> bool:
        return ((host is None or node_host == host) and (rank is None or text.startswith(f"[rank{rank}]:"))
                and (pattern is None or pattern.search(text) is not None))

    def show(node_rank: int, node_host: str, text: str) -> None:
        if wanted(node_host, text):
            typer.echo(f"{prefix(node_rank, node_host)} {text}")

    from ..runs.paths import read_json

    if read_json(run_dir / "run.json").get("backend") == "slurm":
        raise typer.Exit(follow_slurm(run_dir, show) if follow else _read_slurm(run_dir, show))
    if follow:
        raise typer.Exit(_follow(run_dir, show))
    merged = run_dir / "logs" / "merged.log"
    if merged.exists() and merged.stat().st_size:
        with merged.open(encoding="utf-8", errors="replace") as handle:
            for raw in handle:
                match = _LINE.match(raw.rstrip("\n"))
                if match:
                    show(int(match["node"]), match["host"], match["text"])
        return
    _fetch_from_nodes(run_dir, show)


def _read_slurm(run_dir, show) -> int:
    from ..backends.slurm.logs import NodeLogs
    from ..runs.record import load_run

    plan, _, record = load_run(run_dir)
    if not NodeLogs(Path(plan.run_dir), plan.num_nodes).read_new(show):
        _batch_output(record, "no node has written a log yet")
    return 0


def _batch_output(record: dict, why: str, lines: int = 20) -> None:
    """The tail of the batch script's own output (where Slurm and the setup lines report errors)."""
    path = Path(record.get("slurm_output") or "")
    if not path.is_file():
        return
    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    typer.echo(f"fsdpctl: {why}; the end of the batch output ({path}):", err=True)
    for line in tail:
        typer.echo(f"  {line}", err=True)


def follow_slurm(run_dir, show=None) -> int:
    """Follow a Slurm run's node logs until the job ends; record how it ended; its exit code."""
    from ..backends.slurm.logs import follow
    from ..runs import record as runs_record
    from ..runs.paths import RunPaths
    from .stream import LinePrinter

    plan, _, record = runs_record.load_run(run_dir)
    try:
        state = follow(Path(plan.run_dir), plan.num_nodes, record["job_id"], show or LinePrinter(),
                       requeueable=bool(plan.slurm and plan.slurm.requeue))
    except KeyboardInterrupt:
        typer.echo(f"fsdpctl: stopped following; Slurm job {record['job_id']} goes on", err=True)
        return 130
    code = state.exit_code if state.exit_code is not None else (0 if state.state == "COMPLETED" else 1)
    if state.state != "COMPLETED" or code:
        _batch_output(record, f"job {record['job_id']} ended {state.state}")
    runs_record.record(RunPaths(run_dir), plan, None, "succeeded" if state.state == "COMPLETED" and code == 0
                  else state.state.lower(), exit_code=code, slurm_state=state.state, finished_at=runs_record.now())
    typer.echo(f"fsdpctl: Slurm job {record['job_id']} {state.state} (exit {code})", err=True)
    return code


def _fetch_from_nodes(run_dir, show) -> None:
    """A run nobody followed (detached): read each node's log over its transport, once."""
    from ..backends.connect import close_all, open_transports
    from ..errors import HostError
    from ..runs.record import load_run
    from ..shell import after_mark, marked, quote_path

    plan, profile, _ = load_run(run_dir)
    transports = open_transports(profile)
    try:
        for node, transport in zip(plan.nodes, transports, strict=True):
            try:
                _, out, _ = transport.run(marked(f"cat {quote_path(plan.run_dir)}/node{node.node_rank}.log"), 60)
                out = after_mark(out)
            except HostError as exc:
                typer.echo(f"fsdpctl: {exc.message}", err=True)
                continue
            for line in out.splitlines():
                show(node.node_rank, node.host, line)
    finally:
        close_all(transports)


def _follow(run_dir, show) -> int:
    """Follow every node's log until the run ends, with the same fail-fast as launch."""
    from ..backends.connect import close_all, open_transports
    from ..backends.supervisor import NodeRun, Supervisor, node_records
    from ..runs import record as runs_record
    from ..runs.paths import RunPaths, read_json

    plan, profile, record = runs_record.load_run(run_dir)
    if record.get("state") not in ("running", "starting"):
        typer.echo(f"fsdpctl: run {plan.run_id} is {record.get('state')}; showing its logs", err=True)
    pids = {n["node_rank"]: n.get("pid", 0) for n in record.get("nodes", [])}
    transports = open_transports(profile)
    try:
        runs = [NodeRun(node, t, pid=pids.get(node.node_rank, 0), state="running")
                for node, t in zip(plan.nodes, transports, strict=True)]
        result = Supervisor(plan, runs, RunPaths(run_dir).logs, show, write_local=False,
                            stop_on_interrupt=False).run()
        if result.interrupted:
            typer.echo(f"fsdpctl: stopped following; run {plan.run_id} goes on", err=True)
            return 130
        # Only a follower of a detached run that nobody else has settled (stop writes "stopped")
        # records how it ended.
        if record.get("detached") and read_json(run_dir / "run.json").get("state") == "running":
            runs_record.record(RunPaths(run_dir), plan, node_records(runs), "interrupted" if result.interrupted else
                          ("failed" if result.exit_code else "succeeded"), exit_code=result.exit_code,
                          first_failure=result.first_failure, finished_at=runs_record.now())
        return result.exit_code
    finally:
        close_all(transports)
