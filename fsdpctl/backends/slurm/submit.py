"""Submitting a run to Slurm: the run directory on shared storage, then ``sbatch`` or submitit's executor."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from ...bundle import Payload
from ...errors import FsdpctlError
from ...plan.make import SHIPPED_PACKAGE_DIR
from ...plan.types import LaunchPlan
from ...rundir.attempts import attempt_folder, move_into, node_files
from ...rundir.paths import private_dir
from ...rundir.record import now
from ...rundir.rundir import RunDir
from ...rundir.state import Failure, NodeState, RunState
from ...rundir.status import NodeStatus
from ...shell import quote_path
from . import client, via_submitit
from .plan import SlurmPlan
from .scripts import SBATCH_SCRIPT, SUBMITIT_SETUP_SCRIPT


def submit_slurm(run: RunDir, payload: Payload) -> str:
    """Write the run directory on the nodes' shared storage once (the scripts, the workload package,
    the user's code) and submit the job, through ``sbatch`` or submitit's executor; returns Slurm's
    job id, recorded in run.json."""
    plan, slurm = run.plan, SlurmPlan.of(run.plan)
    run_dir = private_dir(Path(plan.run_dir).expanduser())
    if plan.attempt > 1:  # the last attempt's node logs move aside: every node appends to node<R>.log
        for rank in range(plan.num_nodes):
            move_into(run_dir, node_files(rank), attempt_folder(plan.attempt - 1))
    with tarfile.open(fileobj=io.BytesIO(payload.files.getvalue()), mode="r:") as tar:
        tar.extractall(run_dir, filter="data")
    script_name = SUBMITIT_SETUP_SCRIPT if slurm.via == "submitit" else SBATCH_SCRIPT
    try:
        if slurm.via == "submitit":
            job_id = _submit_with_submitit(plan, run_dir, (run_dir / script_name).read_text(encoding="utf-8"),
                                           payload.secrets)
            output = run_dir / "submitit" / f"{job_id}_0_log.out"
        else:
            job_id = client.submit_batch(str(run_dir / script_name), str(run_dir), payload.secrets)
            output = run_dir / f"slurm-{job_id}.out"
    except FsdpctlError as refused:
        # No job was queued: the run ended here, for the reason sbatch gave, and has no nodes.
        failure = Failure(kind="refused", host=None, node_rank=None, exit_code=refused.exit_code,
                          detail=refused.message, failed_at=now())
        run.change(state=RunState.FAILED, exit_code=refused.exit_code, nodes=(), finished_at=failure.failed_at,
                   first_failure=failure, job={"via": slurm.via})
        raise
    pending = tuple(NodeStatus(node_rank=r, host=f"slurm node {r}", state=NodeState.PENDING)
                    for r in range(plan.num_nodes))
    # A job is the scheduler's: it goes on without this process, whoever follows it records its end.
    run.change(state=RunState.SUBMITTED, nodes=pending, submitted_at=now(), detached=True,
               job={"job_id": job_id, "via": slurm.via, "slurm_output": str(output)})
    return job_id


def submitit_job(plan: LaunchPlan, run_dir: Path, setup: str) -> tuple[str, str, dict[str, Any]]:
    """submitit's folder (unique to the run: job ids restart when a cluster is reset), the node
    Python command, and the executor parameters."""
    slurm = SlurmPlan.of(plan)
    params = via_submitit.submitit_parameters(slurm.directives, setup.splitlines(), slurm.signal_seconds)
    return str(run_dir / "submitit"), quote_path(plan.host_python), params  # the hosts' own: submitit is there


def _submit_with_submitit(plan: LaunchPlan, run_dir: Path, setup: str, secrets: dict[str, str]) -> str:
    from ...workload.slurm_task import NodeTask

    slurm = SlurmPlan.of(plan)
    via_submitit.ship_submitit(str(run_dir / SHIPPED_PACKAGE_DIR))
    folder, python, params = submitit_job(plan, run_dir, setup)
    # Leave submitit's task most of the warning time to wait for the workers' checkpoint.
    task = NodeTask(slurm.step_command, str(run_dir), slurm.requeue, save_seconds=max(5.0, slurm.signal_seconds - 10.0))
    return via_submitit.submit_with_submitit(folder, python, params, task, secrets)
