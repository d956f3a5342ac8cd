"""What Slurm says of a run's job, written into run.json: the one record that ``runs``, ``status``
and ``Run.info`` read alike. A job changes state with nobody writing (Slurm starts it once its nodes
are allocated, requeues it, ends it at its time limit), so whoever asks Slurm writes down what it heard."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from ...errors import FsdpctlError
from ...rundir.record import RunRecord
from ...rundir.rundir import RunDir
from ...rundir.state import NodeState, RunState
from ...rundir.status import NodeStatus
from . import client, states
from .follow import record_end
from .logs import NodeLogs
from .plan import SlurmPlan
from .steps import step_nodes

LIST_TIMEOUT = 20.0
"""How long listing the runs waits for squeue: a controller that does not answer leaves the records as they are."""


def node_state(state: RunState) -> NodeState:
    """A node's state in a job in ``state``: Slurm runs every node of a job (or none) at once."""
    if state is RunState.SUBMITTED:
        return NodeState.PENDING
    if not state.is_over:
        return NodeState.RUNNING
    return {RunState.SUCCEEDED: NodeState.SUCCEEDED, RunState.STOPPED: NodeState.STOPPED}.get(state, NodeState.FAILED)


def nodes_of(state: RunState, exit_code: Optional[int], logs: NodeLogs, num_nodes: int) -> tuple[NodeStatus, ...]:
    """Each node of a job in ``state``, as its log names it (its host, its global ranks)."""
    return tuple(NodeStatus(node_rank=rank, host=logs.hosts[rank], state=node_state(state), exit_code=exit_code,
                            ranks=logs.ranks[rank]) for rank in range(num_nodes))


def record_job_state(run: RunDir, slurm: client.JobState, logs: Optional[NodeLogs] = None) -> RunRecord:
    """Write what Slurm just said of the run's job into run.json: an ended job's end as its follower
    records it; a live job's state (queued or running), Slurm's own word for it, how often Slurm
    requeued it, and its nodes (named from ``logs``, else as recorded). Nothing is written over a
    record that says the run ended since (its follower or ``stop`` wrote it) or that is now of a
    newer attempt's job. Returns the record as it now is."""
    if slurm.finished:
        return record_end(run, slurm, unless_ended=True)
    record = run.record
    state = states.live_state(slurm.state)
    if logs is not None:  # the newest step's nodes (an elastic job's may be fewer than the plan's)
        nodes = nodes_of(state, None, logs, step_nodes(Path(run.plan.run_dir).expanduser(), run.plan.num_nodes))
    else:
        nodes = tuple(node.replace(state=node_state(state)) for node in record.nodes)
    job = {"slurm_state": slurm.state, **({"restarts": slurm.restarts} if slurm.restarts else {})}
    job_id = record.job_id
    return run.change_if(lambda now: not now.state.is_over and now.job_id == job_id, state=state, nodes=nodes,
                         job=job)


def refresh_records(runs: Sequence[RunDir]) -> None:
    """Bring the records of these runs up to date where they are live: one ``squeue`` for all their
    jobs, and ``scontrol``/``sacct`` for each job it does not list as live (how that one ended).
    A controller that does not answer leaves the records as they are."""
    asked: dict[str, tuple[RunDir, bool]] = {}
    for run in runs:
        record = run.record
        if not record.state.is_over and record.job_id is not None:
            asked[record.job_id] = (run, SlurmPlan.of(run.plan).requeue)
    try:
        listed = client.queue_states(list(asked), timeout=LIST_TIMEOUT)
        for job_id, (run, requeueable) in asked.items():
            said = listed.get(job_id)
            if said is not None and not client.is_finished(said, requeueable):
                record_job_state(run, client.JobState(said, None, False))
            else:
                record_job_state(run, client.job_state(job_id, requeueable))
    except FsdpctlError:
        return
