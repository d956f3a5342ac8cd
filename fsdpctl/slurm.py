"""The Slurm side of a run: submit the batch script, ask for the job's state, cancel it.

Slurm's own client commands (sbatch, squeue, scontrol, scancel) run on this machine, which must be
a node that can submit jobs; they read ``SLURM_CONF`` like any other client. Argument lists only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from .errors import FsdpctlError, UsageError

TIMEOUT = 60.0
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}


def _slurm(argv: list[str]) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise UsageError(f"{argv[0]} not found", "run fsdpctl submit on a machine that can submit Slurm jobs")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise FsdpctlError(f"{argv[0]} did not answer within {TIMEOUT:g} s",
                           "is slurmctld up? (scontrol ping)") from None


def submit_batch(script: str, cwd: str) -> str:
    """``sbatch`` the script; returns the job id."""
    done = _slurm(["sbatch", "--parsable", f"--chdir={cwd}", script])
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        message = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        raise FsdpctlError(f"sbatch refused the job: {message}", "check the profile's slurm section and sinfo")
    return job_id


@dataclass(frozen=True)
class JobState:
    """What Slurm says of a job; ``exit_code`` once it has ended (None while unknown)."""

    state: str
    exit_code: int | None
    finished: bool
    restarts: int = 0
    """How often Slurm has requeued the job."""


def job_state(job_id: str) -> JobState:
    """From squeue while the job is queued or running, then scontrol (until Slurm forgets the job)."""
    queued = _slurm(["squeue", "-h", "-j", job_id, "-o", "%T"])
    state = queued.stdout.strip().split("\n")[0] if queued.returncode == 0 else ""
    if state and state not in FINISHED:
        return JobState(state, None, False)
    shown = _slurm(["scontrol", "show", "job", job_id])
    found = re.search(r"JobState=(\S+)", shown.stdout)
    code = re.search(r"\bExitCode=(\d+):(\d+)", shown.stdout)
    restarts = re.search(r"\bRestarts=(\d+)", shown.stdout)
    if not found:
        return JobState("UNKNOWN", None, True)  # purged from the controller (MinJobAge) and no accounting
    exit_code = None
    if code:
        status, signal = int(code.group(1)), int(code.group(2))
        exit_code = 128 + signal if signal else status
    finished = found.group(1) in FINISHED
    if found.group(1) in ("PREEMPTED", "NODE_FAIL") and re.search(r"\bRequeue=1\b", shown.stdout):
        finished = False  # a requeueable job passes through these on its way back to PENDING
    return JobState(found.group(1), exit_code, finished, int(restarts.group(1)) if restarts else 0)


def cancel(job_id: str) -> None:
    """``scancel`` the job (every step on every node)."""
    done = _slurm(["scancel", job_id])
    if done.returncode != 0:
        raise FsdpctlError(f"scancel {job_id} failed: {done.stderr.strip()}", "check squeue -j " + job_id)
