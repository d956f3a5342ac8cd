"""The ``slurm`` backend: runs submitted through ``sbatch`` or submitit, followed in their node logs.

Slurm's client commands run on this machine; the run directory is on storage the nodes share, where
every node appends to ``node<R>.log``. ``doctor`` probes nodes allocated with ``srun``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...bundle import Payload
from ...doctor.checks import DoctorReport, HostReport
from ...plan.types import LaunchPlan
from ...profiles.schema import ClusterProfile
from ...runs.paths import files_under
from ...runs.record import Run, last_metrics, now
from ..base import DoctorRequest, LineSink, Outcome
from ..node_commands import STAGED
from ..supervisor import Interrupted, on_stop_signals, raise_interrupted
from . import client
from .logs import NodeLogs, follow
from .submit import submit_slurm, submitit_job

BATCH_TAIL_LINES = 20


class SlurmBackend:
    """A Slurm cluster whose client commands work here (``SLURM_CONF`` is read by them)."""

    name = "slurm"
    queued = True

    def __init__(self, profile: ClusterProfile):
        self.profile = profile

    def close(self) -> None:
        return None

    def doctor(self, request: DoctorRequest, on_host: Callable[[HostReport], None] | None = None) -> DoctorReport:
        """The controller and partition, then the probe on nodes allocated with ``srun``."""
        from .doctor import run_slurm_doctor

        return run_slurm_doctor(self.profile, request, python=self.profile.python or "python3", on_host=on_host)

    def preflight(self, plan: LaunchPlan, payload: Payload,
                  on_host: Callable[[HostReport], None] | None = None) -> None:
        return None  # the nodes are not known before Slurm allocates them; `doctor` probes an allocation

    def previews(self, plan: LaunchPlan, scripts: dict[str, str]) -> dict[str, str]:
        """With ``--via submitit``: the batch script submitit will write (its own writer, so exact)."""
        if plan.slurm is None or plan.slurm.via != "submitit":
            return {}
        from .via_submitit import submitit_preview

        folder, python, params = submitit_job(plan, Path(plan.run_dir), scripts["submitit-setup.sh"])
        return {"submitit.sbatch (as submitit will write it)": submitit_preview(folder, python, params)}

    def start(self, run: Run, payload: Payload, *, detached: bool) -> str:
        return f"submitted as Slurm job {submit_slurm(run, payload)}"

    def follow(self, run: Run, sink: LineSink, *, owner: bool) -> Outcome:
        """The node logs as they grow until Slurm says the job has ended; records how it ended.
        Ctrl-C stops following only: the job is Slurm's, and goes on."""
        plan, job_id = run.plan, run.record["job_id"]
        previous = on_stop_signals(raise_interrupted)  # SIGTERM and SIGHUP as Ctrl-C: say what goes on
        try:
            state = follow(Path(plan.run_dir), plan.num_nodes, job_id, sink,
                           requeueable=bool(plan.slurm and plan.slurm.requeue))
        except Interrupted as stop:
            return Outcome(exit_code=128 + stop.signum, state="detached",
                           message=f"stopped following; Slurm job {job_id} goes on (end it with `fsdpctl stop "
                                   f"{plan.run_id}` or `scancel {job_id}`)")
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        code = state.exit_code if state.exit_code is not None else (0 if state.state == "COMPLETED" else 1)
        succeeded = state.state == "COMPLETED" and code == 0
        notes = () if succeeded else tuple(batch_output(run.record, f"job {job_id} ended {state.state}"))
        outcome_state = "succeeded" if succeeded else state.state.lower()
        run.update(outcome_state, exit_code=code, slurm_state=state.state, finished_at=now())
        return Outcome(exit_code=code, state=outcome_state, message=f"Slurm job {job_id} {state.state} (exit {code})",
                       notes=notes)

    def status(self, run: Run) -> dict[str, Any]:
        """The job's state from Slurm (the controller, then accounting), each node from its log."""
        plan, record = run.plan, run.record
        info: dict[str, Any] = {"run_id": plan.run_id, "state": record.get("state"), "job_id": record.get("job_id"),
                                "exit_code": record.get("exit_code"), "first_failure": None}
        if record.get("state") in ("submitted", "running"):
            state = client.job_state(record["job_id"], requeueable=bool(plan.slurm and plan.slurm.requeue))
            info["slurm_state"] = state.state
            info["restarts"] = state.restarts  # how often Slurm requeued it (preemption, --requeue)
            info["state"] = "running" if not state.finished else (
                "succeeded" if state.state == "COMPLETED" and not state.exit_code else "failed")
            info["exit_code"] = state.exit_code
        logs = NodeLogs(Path(plan.run_dir).expanduser(), plan.num_nodes)
        logs.read_new(lambda rank, host, line: None)
        info["nodes"] = [{"node_rank": rank, "host": logs.hosts[rank], "state": info["state"],
                          "exit_code": info["exit_code"]} for rank in range(plan.num_nodes)]
        metrics = Path(plan.run_dir).expanduser() / "metrics.jsonl"
        info["last_metrics"] = last_metrics([metrics.read_text(encoding="utf-8")] if metrics.exists() else [])
        return info

    def read_logs(self, run: Run, sink: LineSink) -> list[str]:
        if NodeLogs(Path(run.plan.run_dir), run.plan.num_nodes).read_new(sink):
            return []
        return batch_output(run.record, "no node has written a log yet")

    def fetch(self, run: Run, path: str) -> dict[str, list[str]]:
        """The run directory is on storage this machine shares with the nodes: the files are named
        where they are."""
        return {"the shared run directory": files_under(Path(run.plan.run_dir).expanduser() / path, skip=STAGED)}

    def stop(self, run: Run) -> dict[str, str]:
        """``scancel``: Slurm ends every step on every node."""
        job_id = run.record["job_id"]
        client.cancel(job_id)
        run.update("stopped", stopped_at=now())
        return {f"Slurm job {job_id}": ""}


def batch_output(record: dict, why: str, lines: int = BATCH_TAIL_LINES) -> list[str]:
    """The end of the batch script's own output (where Slurm and the setup lines report errors)."""
    path = Path(record.get("slurm_output") or "")
    if not path.is_file():
        return []
    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return [f"fsdpctl: {why}; the end of the batch output ({path}):", *(f"  {line}" for line in tail)]
