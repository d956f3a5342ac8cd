"""The ``slurm`` backend: runs submitted through ``sbatch`` or submitit, followed in their node logs.

Slurm's client commands run on this machine; the run directory is on storage the nodes share, where
every node appends to ``node<R>.log``. ``doctor`` probes nodes allocated with ``srun``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...bundle import Payload
from ...hostcheck.checks import DoctorReport, HostReport
from ...node.stacks import BEGIN as STACKS_BEGIN
from ...node.stacks import END as STACKS_END
from ...node.stacks import answer_of
from ...plan.types import LaunchPlan
from ...profiles.schema import ClusterProfile
from ...rundir.attempts import attempt_folder
from ...rundir.lines import LogLine
from ...rundir.paths import files_under
from ...rundir.record import RunRecord, now
from ...rundir.rundir import RunDir, last_metrics
from ...rundir.state import Failure, NodeState, Outcome, RunState, slurm_ending
from ...rundir.status import NodeStatus, RunStatus
from ...workload.layout import complete_steps
from ..base import DoctorRequest, LineSink
from ..hang_watch import HANG_EXIT, HangWatch
from ..node_commands import STAGED, stacks_command
from ..supervisor import Interrupted, on_stop_signals, raise_interrupted
from . import client
from .logs import NodeLogs, follow
from .submit import submit_slurm, submitit_job
from .tasks import split_tasks

BATCH_TAIL_LINES = 20
STACKS_TIMEOUT = 120.0


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

    def start(self, run: RunDir, payload: Payload, *, detached: bool) -> str:
        return f"submitted as Slurm job {submit_slurm(run, payload)}"

    def follow(self, run: RunDir, sink: LineSink, *, owner: bool, watch: HangWatch | None = None,
               signals: bool = False, leave: threading.Event | None = None) -> Outcome:
        """The node logs as they grow until Slurm says the job has ended; records how it ended.
        An interruption stops following only: the job is Slurm's, and goes on. A hang the watch
        ends is cancelled with scancel and recorded as failed (exit 124)."""
        plan, job_id = run.plan, run.record.job_id
        # SIGTERM and SIGHUP as Ctrl-C: say what goes on.
        previous = on_stop_signals(raise_interrupted) if signals else {}
        hang: list[Failure] = []

        def show(line: LogLine) -> None:
            if watch is not None:
                watch.saw(line.text)
            sink(line)

        def hung() -> bool:
            silent = watch.due() if watch is not None else None
            if silent is not None and (verdict := watch.fire(silent)).stop:
                hang.append(verdict.failure)
                client.cancel(job_id)
                return True
            return False

        left = f"stopped following; Slurm job {job_id} goes on (end it with `fsdpctl stop {plan.run_id}` or " \
               f"`scancel {job_id}`)"
        try:
            state = follow(Path(plan.run_dir), plan.num_nodes, job_id, show,
                           requeueable=bool(plan.slurm and plan.slurm.requeue), give_up=hung, leave=leave)
        except (Interrupted, KeyboardInterrupt) as stop:
            signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
            return Outcome(exit_code=128 + signum, state=RunState.RUNNING, interrupted_by=signum, message=left)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if state is None:
            return Outcome(exit_code=0, state=RunState.RUNNING, message=left)
        if hang:
            run.change(state=RunState.FAILED, exit_code=HANG_EXIT, finished_at=now(), first_failure=hang[0],
                       job={"slurm_state": state.state})
            return Outcome(exit_code=HANG_EXIT, state=RunState.FAILED, first_failure=hang[0])
        outcome_state, code = slurm_ending(state.state, state.exit_code)
        if outcome_state is RunState.CANCELLED and run.record.stopped_at:
            outcome_state = RunState.STOPPED  # fsdpctl stop cancelled it
        notes = () if outcome_state is RunState.SUCCEEDED else tuple(
            batch_output(run.record, f"job {job_id} ended {state.state}"))
        run.change(state=outcome_state, exit_code=code, finished_at=now(), job={"slurm_state": state.state})
        return Outcome(exit_code=code, state=outcome_state, message=f"Slurm job {job_id} {state.state} (exit {code})",
                       notes=notes)

    def status(self, run: RunDir) -> RunStatus:
        """The job's state from Slurm (the controller, then accounting), each node from its log."""
        plan, record = run.plan, run.record
        state, job = record.state, {"job_id": record.job_id, "slurm_state": record.job.get("slurm_state")}
        exit_code = record.exit_code
        if not state.is_over:
            slurm = client.job_state(str(record.job_id), requeueable=bool(plan.slurm and plan.slurm.requeue))
            exit_code = slurm.exit_code
            state = (RunState.from_slurm(slurm.state, exit_code) if slurm.finished else
                     RunState.SUBMITTED if RunState.from_slurm(slurm.state, None) is RunState.SUBMITTED
                     else RunState.RUNNING)
            job.update(slurm_state=slurm.state, restarts=slurm.restarts)  # requeued by Slurm (--requeue)
        logs = NodeLogs(Path(plan.run_dir).expanduser(), plan.num_nodes)
        logs.read_new(lambda line: None)
        node_state = NodeState.PENDING if state is RunState.SUBMITTED else NodeState.RUNNING if not state.is_over \
            else NodeState.SUCCEEDED if state is RunState.SUCCEEDED else NodeState.STOPPED \
            if state is RunState.STOPPED else NodeState.FAILED
        nodes = tuple(NodeStatus(node_rank=rank, host=logs.hosts[rank], state=node_state, exit_code=exit_code)
                      for rank in range(plan.num_nodes))
        metrics = Path(plan.run_dir).expanduser() / "metrics.jsonl"
        last = last_metrics([metrics.read_text(encoding="utf-8")] if metrics.exists() else [])
        return record.status(state=state, exit_code=exit_code, nodes=nodes, last_metrics=last, job=job)

    def checkpoint_steps(self, run: RunDir) -> list[int]:
        """Read where the nodes wrote them: the shared run directory."""
        return complete_steps(Path(run.plan.run_dir).expanduser())

    def read_logs(self, run: RunDir, sink: LineSink, attempt: int | None = None) -> list[str]:
        run_dir = Path(run.plan.run_dir).expanduser()
        if attempt not in (None, run.attempt):
            earlier = run_dir / attempt_folder(attempt)
            found = NodeLogs(earlier, run.plan.num_nodes).read_new(sink, final=True)
            return [] if found else [f"fsdpctl: attempt {attempt} left no node log in {earlier}"]
        if NodeLogs(run_dir, run.plan.num_nodes).read_new(sink, final=True):
            return []
        return batch_output(run.record, "no node has written a log yet")

    def stacks(self, run: RunDir, *, flight: bool = False, py_spy: bool = True, native: bool = False
               ) -> list[dict[str, Any]]:
        """Every rank's stack: one ``srun --overlap`` step into the job, one task per node."""
        plan, job_id = run.plan, run.record.job_id
        command = stacks_command(plan.run_dir, plan.run_id, plan.python, '"$SLURM_NODEID"', flight=flight,
                                 py_spy=py_spy, native=native)
        argv = ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={plan.num_nodes}", "--ntasks-per-node=1",
                "--label", "--kill-on-bad-exit=0", "bash", "-c", command]
        done = client.run_client(argv, timeout=STACKS_TIMEOUT)
        tasks = split_tasks(done.stdout, STACKS_BEGIN, STACKS_END)
        nodes = []
        for task in range(plan.num_nodes):
            try:
                found = answer_of(tasks.get(task, ""))
            except ValueError:
                why = client.last_line(done.stderr, f"srun exited {done.returncode}")
                nodes.append({"host": f"task {task}", "node_rank": task, "ranks": [], "error": why})
                continue
            nodes.append({**found, "hostname": found.get("host")})
        return sorted(nodes, key=lambda n: n.get("node_rank") if n.get("node_rank") is not None else 1 << 30)

    def fetch(self, run: RunDir, path: str) -> dict[str, list[str]]:
        """The run directory is on storage this machine shares with the nodes: the files are named
        where they are."""
        return {"the shared run directory": files_under(Path(run.plan.run_dir).expanduser() / path, skip=STAGED)}

    def stop(self, run: RunDir) -> dict[str, str]:
        """``scancel``: Slurm ends every step on every node."""
        job_id = str(run.record.job_id)
        client.cancel(job_id)
        run.change(state=RunState.STOPPED, stopped_at=now())
        return {f"Slurm job {job_id}": ""}


def batch_output(record: RunRecord, why: str, lines: int = BATCH_TAIL_LINES) -> list[str]:
    """The end of the batch script's own output (where Slurm and the setup lines report errors)."""
    path = Path(record.job.get("slurm_output") or "")
    if not path.is_file():
        return []
    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return [f"fsdpctl: {why}; the end of the batch output ({path}):", *(f"  {line}" for line in tail)]
