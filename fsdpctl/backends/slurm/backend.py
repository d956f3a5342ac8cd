"""The ``slurm`` backend: runs submitted through ``sbatch`` or submitit, followed in their node logs.

Slurm's client commands run on this machine; the run directory is on storage the nodes share, where
every node appends to ``node<R>.log``. ``doctor`` probes nodes allocated with ``srun``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from ...bundle import Payload
from ...errors import HostError
from ...hostcheck.checks import DoctorReport, HostReport
from ...metrics.gpu_samples import newest_samples, newest_text
from ...node.stacks import BEGIN as STACKS_BEGIN
from ...node.stacks import END as STACKS_END
from ...node.stacks import answer_of
from ...plan.types import LaunchPlan, Overrides, Placement, PlanContext
from ...profiles.schema import ClusterProfile
from ...rundir.attempts import attempt_folder
from ...rundir.paths import files_under
from ...rundir.record import now
from ...rundir.rundir import RunDir, last_metrics
from ...rundir.state import NodeState, RunState
from ...rundir.status import NodeStatus, RunStatus
from ...shell import quote_path
from ..base import Backend, DoctorRequest, LineSink, Preflight, ProfileProblem
from ..nodes.commands import STAGED, stacks_command
from ..transport import LocalTransport
from . import client, states
from .follow import SlurmFollower, batch_output
from .logs import NodeLogs
from .plan import OPTIONS, SlurmPlan, finish_slurm_plan, slurm_placement
from .scripts import SUBMITIT_SETUP_SCRIPT, slurm_scripts
from .steps import metrics_text, spare_changes
from .submit import submit_slurm, submitit_job
from .tasks import split_tasks

STACKS_TIMEOUT = 120.0
ASK_TIMEOUT = 60.0


class SlurmBackend(Backend):
    """A Slurm cluster whose client commands work here (``SLURM_CONF`` is read by them)."""

    name = "slurm"
    queued = True
    options = OPTIONS

    # ---- the class's pure part -------------------------------------------------------------------
    @classmethod
    def check_profile(cls, profile: ClusterProfile) -> Optional[ProfileProblem]:
        if profile.slurm is None:
            return "slurm", "a slurm profile needs a slurm section", "add slurm: {nodes: 2, ...}"
        return None

    @classmethod
    def placement(cls, profile: ClusterProfile, overrides: Overrides, context: PlanContext) -> Placement:
        return slurm_placement(cls.name, profile, overrides, context)

    @classmethod
    def finish_plan(cls, profile: ClusterProfile, overrides: Overrides, plan: LaunchPlan) -> LaunchPlan:
        return finish_slurm_plan(profile, overrides, plan)

    @classmethod
    def scripts(cls, plan: LaunchPlan) -> dict[str, str]:
        return slurm_scripts(plan)

    @classmethod
    def layout(cls, profile: ClusterProfile) -> tuple[Optional[int], Optional[int]]:
        if profile.slurm is None:
            return super().layout(profile)
        return profile.slurm.nodes, profile.slurm.gpus_per_node

    # ---- checking ------------------------------------------------------------------------------
    def doctor(self, request: DoctorRequest, on_host: Callable[[HostReport], None] | None = None) -> DoctorReport:
        """The controller and partition, then the probe on nodes allocated with ``srun``."""
        from ...hostcheck.fanout import host_python
        from .doctor import run_slurm_doctor

        python = host_python(self.profile, self.profile.python or "python3")  # with a container: the hosts' own
        return run_slurm_doctor(self.profile, request, python=python, on_host=on_host)

    def preflight(self, plan: LaunchPlan, payload: Payload,
                  on_host: Callable[[HostReport], None] | None = None) -> Preflight:
        return Preflight()  # the nodes are not known before Slurm allocates them; `doctor` probes an allocation

    def previews(self, plan: LaunchPlan, scripts: dict[str, str]) -> dict[str, str]:
        """With ``--via submitit``: the batch script submitit will write (its own writer, so exact)."""
        if SlurmPlan.of(plan).via != "submitit":
            return {}
        from .via_submitit import submitit_preview

        folder, python, params = submitit_job(plan, Path(plan.run_dir), scripts[SUBMITIT_SETUP_SCRIPT])
        return {"submitit.sbatch (as submitit will write it)": submitit_preview(folder, python, params)}

    # ---- a run -----------------------------------------------------------------------------------
    def start(self, run: RunDir, payload: Payload, *, detached: bool,
              preflight: Optional[Preflight] = None) -> SlurmFollower:
        return SlurmFollower(run, f"submitted as Slurm job {submit_slurm(run, payload)}")

    def attach(self, run: RunDir) -> SlurmFollower:
        return SlurmFollower(run, "")

    def status(self, run: RunDir) -> RunStatus:
        """The job's state from Slurm (the controller, then accounting), each node from its log."""
        plan, record = run.plan, run.record
        state, job = record.state, {"job_id": record.job_id, "slurm_state": record.job.get("slurm_state")}
        exit_code = record.exit_code
        if not state.is_over:
            slurm = client.job_state(str(record.job_id), requeueable=SlurmPlan.of(plan).requeue)
            exit_code = slurm.exit_code
            state = states.run_state(slurm.state, exit_code) if slurm.finished else states.live_state(slurm.state)
            job.update(slurm_state=slurm.state, restarts=slurm.restarts)  # requeued by Slurm (--requeue)
        run_dir = Path(plan.run_dir).expanduser()
        logs = NodeLogs(run_dir, plan.num_nodes)
        logs.read_new(lambda line: None)
        node_state = NodeState.PENDING if state is RunState.SUBMITTED else NodeState.RUNNING if not state.is_over \
            else NodeState.SUCCEEDED if state is RunState.SUCCEEDED else NodeState.STOPPED \
            if state is RunState.STOPPED else NodeState.FAILED
        nodes = tuple(NodeStatus(node_rank=rank, host=logs.hosts[rank], state=node_state, exit_code=exit_code,
                                 ranks=logs.ranks[rank]) for rank in range(plan.num_nodes))
        metrics = metrics_text(run_dir)
        gpus = [newest_text(path) for path in sorted(run_dir.glob("gpu/node*.jsonl"))]
        return record.status(state=state, exit_code=exit_code, nodes=nodes, job=job,
                             last_metrics=last_metrics([metrics] if metrics else []), gpu_samples=newest_samples(gpus),
                             **spare_changes(run_dir, metrics))  # which node failed, which spare took its place

    def ask(self, run: RunDir, command: str) -> str:
        """Run here: the run directory is on storage this machine shares with the nodes."""
        status, out, err = LocalTransport().run(f"cd {quote_path(run.plan.run_dir)} && {command}", ASK_TIMEOUT)
        if status != 0 and not out:
            raise HostError("the shared run directory", "command", err.strip() or f"exit {status}",
                            f"check that {run.plan.run_dir} is reachable from this machine")
        return out

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
        command = stacks_command(plan.run_dir, plan.run_id, plan.host_python, '"$SLURM_NODEID"', flight=flight,
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
