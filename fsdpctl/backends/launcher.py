"""A launch from start to end: preflight, stage and start every node, supervise, collect, record.

The CLI calls these in order; each step leaves the run directory describing what happened, so
``logs``/``status``/``stop`` work on it later, from another terminal too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from ..doctor.checks import DoctorReport
from ..doctor.fanout import make_jobs, run_doctor
from ..plan.types import LaunchPlan
from ..profiles.schema import ClusterProfile
from ..runs.paths import RunPaths
from ..runs.record import load_run, now, record
from .connect import master_of, node_python
from .supervisor import NodeRun, RunResult, Supervisor, fetch_logs, node_records, start_run, stop_run
from .transport import Transport

PREFLIGHT_TIMEOUT = 20.0


def preflight(profile: ClusterProfile, plan: LaunchPlan, transports: Sequence[Transport],
              on_host: Callable | None = None) -> DoctorReport:
    """doctor's fast checks on the plan's own hosts and rendezvous port (connections are kept)."""
    master_rank, master_addr = master_of(profile)
    port_check = profile.backend == "ssh" and plan.num_nodes > 1
    jobs = make_jobs(profile, transports, master_rank, master_addr, plan.master_port, deep=False,
                     port_check=port_check)
    nproc = int(plan.nproc_per_node) if plan.nproc_per_node.isdigit() else None
    return run_doctor(profile, jobs, python=node_python(profile), timeout=PREFLIGHT_TIMEOUT, nproc=nproc,
                      on_host=on_host)


def start(paths: RunPaths, plan: LaunchPlan, scripts: dict[str, str], transports: Sequence[Transport],
          detached: bool) -> list[NodeRun]:
    """Stage and start every node, and record their process ids."""
    runs = start_run(plan, scripts, transports)
    record(paths, plan, node_records(runs), "running", started_at=now(), detached=detached)
    return runs


def supervise(paths: RunPaths, plan: LaunchPlan, runs: list[NodeRun], sink) -> RunResult:
    """Follow the run to its end (fail-fast, Ctrl-C), collect the nodes' logs, record the outcome."""
    result = Supervisor(plan, runs, paths.logs, sink).run()
    if result.first_failure and result.first_failure.get("error_file"):
        result.first_failure["error"] = read_error_file(runs[result.first_failure["node_rank"]].transport,
                                                        result.first_failure["error_file"])
    if Path(plan.run_dir).expanduser().resolve() != paths.root.resolve():
        fetch_logs(plan, runs, paths.root)
    state = "interrupted" if result.interrupted else ("failed" if result.exit_code else "succeeded")
    record(paths, plan, node_records(runs), state, finished_at=now(), exit_code=result.exit_code,
           first_failure=result.first_failure)
    return result


def read_error_file(transport: Transport, path: str) -> str | None:
    """The message of a failed rank's torchelastic error file (written by @record), read on its node."""
    from ..errors import HostError
    from ..shell import after_mark, marked, quote_path

    try:
        _, out, _ = transport.run(marked(f"cat {quote_path(path)} 2>/dev/null"), 30)
        message = json.loads(after_mark(out)).get("message", {})
    except (HostError, ValueError, AttributeError):
        return None
    text = message.get("message") if isinstance(message, dict) else message
    return str(text).strip().splitlines()[-1] if text else None


def stop(run_dir: Path, transports: Sequence[Transport]) -> dict[str, str]:
    """End every process of a run on every node and record it as stopped."""
    plan, _, data = load_run(run_dir)
    if data.get("backend") == "slurm":
        from .slurm.client import cancel

        cancel(data["job_id"])
        record(RunPaths(run_dir), plan, None, "stopped", stopped_at=now())
        return {f"Slurm job {data['job_id']}": ""}
    remaining = stop_run(plan.run_id, transports)
    nodes = [{**n, "state": "stopped"} if n.get("state") in ("running", "starting") else n
             for n in data.get("nodes", [])]
    record(RunPaths(run_dir), plan, nodes, "stopped", stopped_at=now(), remaining=remaining)
    return remaining

