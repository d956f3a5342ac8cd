"""Slurm's client commands: submit the batch script, ask for the job's state, cancel it.

Slurm's own client commands (sbatch, squeue, scontrol, scancel) run on this machine, which must be
a node that can submit jobs; they read ``SLURM_CONF`` like any other client. Argument lists only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from ...errors import FsdpctlError, UsageError

TIMEOUT = 60.0
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}


def run_client(argv: list[str], timeout: float = TIMEOUT,
               env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run one Slurm client command (an argument list, never a shell line) and capture its output;
    ``env`` adds variables to its environment (sbatch hands its environment to the job)."""
    if shutil.which(argv[0]) is None:
        raise UsageError(f"{argv[0]} not found", "run fsdpctl on a machine that can submit Slurm jobs")
    try:
        # umask: the job (its output files, the run directory) is this user's only: Slurm passes it on.
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, umask=0o077,
                              env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        raise FsdpctlError(f"{argv[0]} did not answer within {timeout:g} s",
                           "is slurmctld up? (scontrol ping)") from None


def last_line(text: str | bytes | None, default: str) -> str:
    """The last non-empty line of a command's output (where Slurm's clients put the error)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (str(text or "").strip().splitlines() or [default])[-1]


def submit_batch(script: str, cwd: str, secrets: Optional[dict[str, str]] = None) -> str:
    """``sbatch`` the script; returns the job id. ``secrets`` reach the job through sbatch's own
    environment (Slurm exports the submitting environment to the job), never the script."""
    done = run_client(["sbatch", "--parsable", "--export=ALL", f"--chdir={cwd}", script], env=secrets)
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        raise FsdpctlError(f"sbatch refused the job: {last_line(done.stderr, 'no answer')}",
                           "check the profile's slurm section and sinfo")
    return job_id


@dataclass(frozen=True)
class JobState:
    """What Slurm says of a job; ``exit_code`` once it has ended (None while unknown)."""

    state: str
    exit_code: int | None
    finished: bool
    restarts: int = 0
    """How often Slurm has requeued the job."""


def _exit_code(text: str) -> int | None:
    """Slurm's ``status:signal`` as a shell reports it (128+N when a signal ended it)."""
    match = re.search(r"(\d+):(\d+)", text)
    if not match:
        return None
    status, signal = int(match.group(1)), int(match.group(2))
    return 128 + signal if signal else status


def parse_sacct(text: str) -> JobState | None:
    """The job's line of ``sacct -X -n -P -o State,ExitCode`` (``CANCELLED by 0`` -> CANCELLED)."""
    for line in text.strip().splitlines():
        fields = line.split("|")
        if len(fields) >= 2 and fields[0]:
            state = fields[0].split()[0]
            return JobState(state, _exit_code(fields[1]), state in FINISHED)
    return None


def is_finished(state: str, requeueable: bool = False) -> bool:
    """The job in this state has ended; for a job submitted to be requeued (``requeueable``),
    PREEMPTED and NODE_FAIL are on its way back to PENDING."""
    return state in FINISHED and not (requeueable and state in ("PREEMPTED", "NODE_FAIL"))


def job_state(job_id: str, requeueable: bool = False) -> JobState:
    """From the controller (``scontrol show job``) while it remembers the job (MinJobAge after it
    ends), then the accounting database (sacct) where the cluster keeps one. ``requeueable``: the
    job was submitted to be requeued, so PREEMPTED or NODE_FAIL are on its way back to PENDING."""
    shown = run_client(["scontrol", "show", "job", job_id])
    found = re.search(r"JobState=(\S+)", shown.stdout) if shown.returncode == 0 else None
    if not found:
        accounted = run_client(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"])
        known = parse_sacct(accounted.stdout) if accounted.returncode == 0 else None
        return known or JobState("UNKNOWN", None, True)  # forgotten, and no accounting to ask
    state = found.group(1)
    code = re.search(r"\bExitCode=(\d+:\d+)", shown.stdout)
    restarts = re.search(r"\bRestarts=(\d+)", shown.stdout)
    finished = is_finished(state, requeueable)
    return JobState(state, _exit_code(code.group(1)) if code and finished else None, finished,
                    int(restarts.group(1)) if restarts else 0)


def queue_states(job_ids: Sequence[str], timeout: float = TIMEOUT) -> dict[str, str]:
    """Each job's state as the controller lists it (``RUNNING``, ``PENDING``...), all of ``job_ids``
    in one ``squeue``. A job the controller no longer lists (it ended a while ago) is not in the
    answer, nor is any job when squeue refused the list (an id it has never heard of): ask those one
    by one (``job_state``)."""
    if not job_ids:
        return {}
    done = run_client(["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}", "--format=%i %T"],
                      timeout=timeout)
    if done.returncode != 0:
        return {}
    listed = (line.split() for line in done.stdout.splitlines())
    return {fields[0]: fields[1] for fields in listed if len(fields) == 2 and fields[0] in job_ids}


def signal_steps(job_id: str, name: str) -> None:
    """``scancel --signal=NAME``: every process of the job's steps gets it (the batch script does not);
    the job goes on. A job that ended meanwhile is no error."""
    run_client(["scancel", f"--signal={name}", job_id])


def cancel(job_id: str) -> None:
    """``scancel`` the job (every step on every node)."""
    done = run_client(["scancel", job_id])
    if done.returncode != 0:
        raise FsdpctlError(f"scancel {job_id} failed: {done.stderr.strip()}", "check squeue -j " + job_id)
