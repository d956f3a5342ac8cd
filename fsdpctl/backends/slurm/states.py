"""Slurm's words for a job's state, as run states: the one place that knows them."""

from __future__ import annotations

from typing import Optional

from ...rundir.state import RunState

SLURM_STATES = {
    "PENDING": RunState.SUBMITTED, "CONFIGURING": RunState.SUBMITTED, "REQUEUED": RunState.SUBMITTED,
    "REQUEUE_HOLD": RunState.SUBMITTED, "REQUEUE_FED": RunState.SUBMITTED, "RESV_DEL_HOLD": RunState.SUBMITTED,
    "RUNNING": RunState.RUNNING, "COMPLETING": RunState.RUNNING, "SUSPENDED": RunState.RUNNING,
    "STAGE_OUT": RunState.RUNNING, "SIGNALING": RunState.RUNNING, "RESIZING": RunState.RUNNING,
    "COMPLETED": RunState.SUCCEEDED, "FAILED": RunState.FAILED, "CANCELLED": RunState.CANCELLED,
    "TIMEOUT": RunState.TIMEOUT, "DEADLINE": RunState.TIMEOUT, "NODE_FAIL": RunState.NODE_FAIL,
    "BOOT_FAIL": RunState.NODE_FAIL, "PREEMPTED": RunState.PREEMPTED, "OUT_OF_MEMORY": RunState.OUT_OF_MEMORY,
    "UNKNOWN": RunState.UNKNOWN,
}
"""Every job state Slurm reports (``squeue``/``sacct``), as a run state."""


def run_state(slurm_state: str, exit_code: Optional[int]) -> RunState:
    """Slurm's job state (``COMPLETED``, ``TIMEOUT``...) as a run state; a completed job that exited
    non-zero failed."""
    state = SLURM_STATES.get(slurm_state.upper(), RunState.UNKNOWN)
    if state is RunState.SUCCEEDED and exit_code:
        return RunState.FAILED
    return state


def live_state(slurm_state: str) -> RunState:
    """A job that has not ended: waiting in the queue, or running."""
    return RunState.SUBMITTED if run_state(slurm_state, None) is RunState.SUBMITTED else RunState.RUNNING


def ending(slurm_state: str, exit_code: Optional[int]) -> tuple[RunState, int]:
    """The state and exit code of a Slurm job that has ended. A job that failed on Slurm's side
    (TIMEOUT, NODE_FAIL, CANCELLED by someone else...) exits non-zero even where Slurm's ExitCode
    says 0:0, so that no script mistakes it for a success."""
    code = exit_code if exit_code is not None else (0 if slurm_state.upper() == "COMPLETED" else 1)
    state = run_state(slurm_state, code)
    return state, (1 if state.is_failure and code == 0 else code)
