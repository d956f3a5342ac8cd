"""The ``slurm`` backend: runs submitted through ``sbatch`` or submitit, followed in their node logs.

Slurm's client commands run on this machine; the run directory is on storage the nodes share, where
every node appends to ``node<R>.log``. ``doctor`` probes nodes allocated with ``srun``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from ...bundle import Payload
from ...errors import FsdpctlError, HostError, UsageError
from ...hostcheck.checks import DoctorReport, HostReport
from ...metrics.gpu_samples import newest_samples, newest_text
from ...node import profile_request
from ...node.stacks import BEGIN as STACKS_BEGIN
from ...node.stacks import END as STACKS_END
from ...node.stacks import answer_of
from ...plan.types import LaunchPlan, Overrides, Placement, PlanContext
from ...profiles.schema import ClusterProfile
from ...rundir.attempts import attempt_folder
from ...rundir.paths import files_under
from ...rundir.record import now
from ...rundir.rundir import RunDir, last_metrics
from ...rundir.state import RunState
from ...rundir.status import RunStatus
from ...shell import quote_path
from ..base import Backend, DoctorRequest, LineSink, Preflight, ProfileProblem
from ..nodes.commands import STAGED, profile_request_command, stacks_command
from ..transport import LocalTransport
from . import client
from .follow import SlurmFollower, batch_output
from .logs import NodeLogs, NodeLogsTail
from .plan import OPTIONS, SlurmPlan, finish_slurm_plan, slurm_placement
from .records import nodes_of, record_job_state, refresh_records
from .scripts import SUBMITIT_SETUP_SCRIPT, slurm_scripts
from .steps import metrics_text, spare_changes, step_hosts, step_nodes
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
        if profile.elastic is not None and profile.elastic.min_nodes > profile.slurm.nodes:
            return ("elastic.min_nodes", f"{profile.elastic.min_nodes} is more than slurm.nodes "
                    f"({profile.slurm.nodes})", f"give {profile.slurm.nodes} or fewer, or raise slurm.nodes")
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

    def make_environment(self, plan: LaunchPlan, on_bytes: Callable[[int, int], None] | None = None,
                         on_node: Callable[[Any], None] | None = None) -> list[Any]:
        """The environment resolved for the nodes' platform (their last check's) and put in the run
        directory: the job's first step makes it on every allocated node."""
        from ...environment.staging import stage_environment

        staged = stage_environment(plan, self.profile.name)
        if on_node is not None:
            on_node(staged)
        return [staged]

    # ---- a run -----------------------------------------------------------------------------------
    def start(self, run: RunDir, payload: Payload, *, detached: bool,
              preflight: Optional[Preflight] = None) -> SlurmFollower:
        from ...rundir.timeline import timeline_for

        with timeline_for(run.run_id, run.attempt).span("submit"):
            job_id = submit_slurm(run, payload)
        return SlurmFollower(run, f"submitted as Slurm job {job_id}", collect=True)

    def attach(self, run: RunDir, *, collect: bool = False) -> SlurmFollower:
        return SlurmFollower(run, "", collect=collect)

    @classmethod
    def refresh_records(cls, runs: Sequence[RunDir]) -> None:
        """One ``squeue`` for the jobs of every live run (then each job it no longer lists as live),
        written into their run.json."""
        refresh_records(runs)

    def status(self, run: RunDir) -> RunStatus:
        """The job's state from Slurm (the controller, then accounting) while it is live, written into
        run.json (so ``runs`` and ``Run.info`` say the same); each node from its log. A run without
        a job (sbatch refused it) has no nodes."""
        plan, record = run.plan, run.record
        run_dir = Path(plan.run_dir).expanduser()
        logs = NodeLogs(run_dir, plan.num_nodes)
        logs.read_new(lambda line: None)
        if not record.state.is_over and record.job_id is not None:
            slurm = client.job_state(record.job_id, requeueable=SlurmPlan.of(plan).requeue)
            record = record_job_state(run, slurm, logs)
        nodes = () if record.job_id is None else nodes_of(record.state, record.exit_code, logs,
                                                          step_nodes(run_dir, plan.num_nodes))
        job = {"job_id": record.job_id, "slurm_state": record.job.get("slurm_state"),
               "restarts": record.job.get("restarts")}  # requeued by Slurm (--requeue)
        metrics = metrics_text(run_dir)
        gpus = [newest_text(path) for path in sorted(run_dir.glob("gpu/node*.jsonl"))]
        return record.status(nodes=nodes, job=job, last_metrics=last_metrics([metrics] if metrics else []),
                             gpu_samples=newest_samples(gpus),
                             **spare_changes(run_dir, metrics))  # which node failed, which spare took its place

    def log_tail(self, run: RunDir) -> NodeLogsTail:
        """The node logs in the shared run directory, as they grow."""
        return NodeLogsTail(Path(run.plan.run_dir).expanduser(), run.plan.num_nodes)

    def scheduler_status(self, run: RunDir) -> RunStatus:
        """``status``: Slurm's word on the job (squeue, then accounting) and the shared directory's files."""
        return self.status(run)

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
        """Every rank's stack: one ``srun --overlap`` step into the job, one task per node (a job with
        spares, or an elastic one: on the newest step's nodes, numbered as that step numbers them)."""
        plan = run.plan
        command = stacks_command(plan.run_dir, plan.run_id, plan.host_python, '"$SLURM_NODEID"', flight=flight,
                                 py_spy=py_spy, native=native)
        return self._on_every_node(run, command, STACKS_BEGIN, STACKS_END, answer_of)

    def profile_request(self, run: RunDir, request: str, ranks: str) -> list[dict[str, Any]]:
        """The request handed to the chosen ranks: one ``srun --overlap`` step, one task per node."""
        plan = run.plan
        command = profile_request_command(plan.run_dir, plan.run_id, plan.host_python, '"$SLURM_NODEID"',
                                          ranks=ranks, request=request)
        return self._on_every_node(run, command, profile_request.BEGIN, profile_request.END,
                                   profile_request.answer_of)

    def _on_every_node(self, run: RunDir, command: str, begin: str, end: str,
                       read: Callable[[str], dict[str, Any]]) -> list[dict[str, Any]]:
        """``command`` in one task per node of the job's newest step; each task's answer, by node."""
        hosts = step_hosts(Path(run.plan.run_dir).expanduser())
        count = len(hosts) or run.plan.num_nodes
        argv = ["srun", "--overlap", f"--jobid={run.record.job_id}", f"--nodes={count}", "--ntasks-per-node=1",
                *([f"--nodelist={','.join(hosts)}"] if hosts else []), "--label", "--kill-on-bad-exit=0",
                "bash", "-c", command]
        done = client.run_client(argv, timeout=STACKS_TIMEOUT)
        tasks = split_tasks(done.stdout, begin, end)
        nodes = []
        for task in range(count):
            try:
                found = read(tasks.get(task, ""))
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

    def stop(self, run: RunDir, grace: Optional[int] = None, stop_signal: Optional[str] = None) -> dict[str, str]:
        """``scancel --signal`` (the profile's stop signal, to every process of the job's steps: the
        ranks save and leave), up to the grace for the job to end, then ``scancel``: Slurm ends every
        step on every node. The stop is marked in the shared run directory first, as over SSH.
        Refused (UsageError) for a run that has no job: nothing of it runs."""
        from ...workload.config import STOP_MARKER
        record, plan = run.record, run.plan
        if record.job_id is None:
            why = f" ({record.first_failure.describe()})" if record.first_failure else ""
            raise UsageError(f"run {run.run_id}: nothing to stop: it has no Slurm job{why}",
                             f"`fsdpctl status {run.run_id}` says how it stands")
        job_id = record.job_id
        grace = plan.stop_grace if grace is None else grace
        live = not record.state.is_over
        if live:
            run.change(stopped_at=now())
        if live and grace > 0 and client.queue_states([job_id]).get(job_id) == "RUNNING":
            try:
                (Path(plan.run_dir).expanduser() / STOP_MARKER).touch()
            except OSError:
                pass  # not shared here: the ranks exit as on anyone's signal
            client.signal_steps(job_id, stop_signal or plan.stop_signal)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and client.queue_states([job_id]).get(job_id) in ("RUNNING",
                                                                                                 "COMPLETING"):
                time.sleep(0.5)
        try:
            client.cancel(job_id)
        except FsdpctlError:
            if not client.job_state(job_id).finished:
                raise
            # its ranks saved and left within the grace: the job had ended, nothing was left to cancel
        run.change(state=RunState.STOPPED, stopped_at=run.record.stopped_at or now(),
                   stop_checkpoint=self.stop_checkpoint(run) if live else None)
        return {f"Slurm job {job_id}": ""}
