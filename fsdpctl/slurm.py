"""The Slurm side of a run: submit the batch script, ask for the job's state, cancel it.

Slurm's own client commands (sbatch, squeue, scontrol, scancel) run on this machine, which must be
a node that can submit jobs; they read ``SLURM_CONF`` like any other client. Argument lists only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import FsdpctlError, UsageError
from .plan import time_limit_minutes

TIMEOUT = 60.0
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE"}


def run_client(argv: list[str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """Run one Slurm client command (an argument list, never a shell line) and capture its output."""
    if shutil.which(argv[0]) is None:
        raise UsageError(f"{argv[0]} not found", "run fsdpctl on a machine that can submit Slurm jobs")
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise FsdpctlError(f"{argv[0]} did not answer within {timeout:g} s",
                           "is slurmctld up? (scontrol ping)") from None


def last_line(text: str | bytes | None, default: str) -> str:
    """The last non-empty line of a command's output (where Slurm's clients put the error)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (str(text or "").strip().splitlines() or [default])[-1]


def submit_batch(script: str, cwd: str) -> str:
    """``sbatch`` the script; returns the job id."""
    done = run_client(["sbatch", "--parsable", f"--chdir={cwd}", script])
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
    finished = state in FINISHED and not (requeueable and state in ("PREEMPTED", "NODE_FAIL"))
    return JobState(state, _exit_code(code.group(1)) if code and finished else None, finished,
                    int(restarts.group(1)) if restarts else 0)


def cancel(job_id: str) -> None:
    """``scancel`` the job (every step on every node)."""
    done = run_client(["scancel", job_id])
    if done.returncode != 0:
        raise FsdpctlError(f"scancel {job_id} failed: {done.stderr.strip()}", "check squeue -j " + job_id)


# --via submitit: submitit's Slurm executor writes and submits its own batch script, which starts
# one submitit task per node; each task runs the node's step command (fsdpctl.workload.slurm_task).
# submitit is imported here only, and only for such a submission.
SUBMITIT_PACKAGES = ("submitit", "cloudpickle", "typing_extensions")
"""What submitit's task needs on the nodes; shipped into the run directory's ``pkg`` with the workload."""
_SUBMITIT_NAMED = {"job-name": "job_name", "nodes": "nodes", "ntasks-per-node": "ntasks_per_node",
                   "gpus-per-node": "gpus_per_node", "cpus-per-task": "cpus_per_task", "partition": "partition",
                   "account": "account", "qos": "qos", "time": "time", "constraint": "constraint"}
_SUBMITIT_OWNED = ("output", "open-mode", "signal")  # submitit writes these itself (open-mode is append)
_INTEGER_PARAMETERS = ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task")


def submitit_parameters(directives: tuple[tuple[str, str], ...], setup: list[str],
                        signal_seconds: int) -> dict[str, object]:
    """The plan's ``#SBATCH`` directives as submitit SlurmExecutor parameters."""
    params: dict[str, object] = {"setup": setup, "signal_delay_s": signal_seconds, "stderr_to_stdout": True,
                                 "srun_args": ["--kill-on-bad-exit=1"]}
    extra: dict[str, object] = {}
    for name, value in directives:
        if name in _SUBMITIT_OWNED:
            continue
        key = _SUBMITIT_NAMED.get(name)
        if key == "time":
            # submitit keeps the limit in minutes (it compares run time against it on SIGUSR2).
            minutes = time_limit_minutes(value)
            if minutes is None:
                extra["time"] = value
            else:
                params["time"] = minutes
        elif key is None:
            extra[name] = value or True  # True: a flag without a value (--requeue, --exclusive)
        else:
            params[key] = int(value) if key in _INTEGER_PARAMETERS else value
    if extra:
        params["additional_parameters"] = extra
    return params


def _import_submitit():
    try:
        import submitit
    except ImportError:
        raise UsageError("--via submitit: the submitit package is not installed here",
                         "pip install submitit, or use --via sbatch") from None
    return submitit


def submitit_preview(folder: str, python: str, params: dict[str, object]) -> str:
    """The batch script submitit would submit (its own writer, so the preview is exact)."""
    import shlex

    _import_submitit()
    from submitit.slurm.slurm import _make_sbatch_string

    command = f"{python} -u -m submitit.core._submit {shlex.quote(folder)}"
    return _make_sbatch_string(command=command, folder=folder, **params)  # type: ignore[arg-type]


def ship_submitit(pkg_dir: str) -> None:
    """Copy submitit and its pure-Python dependencies into the run's ``pkg``: a node needs only
    Python and torch, as with the other ways of running, and runs the submitter's version."""
    import importlib

    _import_submitit()
    for name in SUBMITIT_PACKAGES:
        source = Path(importlib.import_module(name).__file__)  # type: ignore[arg-type]
        if source.name == "__init__.py":
            shutil.copytree(source.parent, Path(pkg_dir) / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "test_*.py", "conftest.py"))
        else:
            shutil.copy2(source, Path(pkg_dir) / source.name)


def submit_with_submitit(folder: str, python: str, params: dict[str, object], task: object) -> str:
    """Submit ``task`` (one per node) through submitit's SlurmExecutor; returns the job id."""
    submitit = _import_submitit()
    if shutil.which("srun") is None or shutil.which("sbatch") is None:
        raise UsageError("srun/sbatch not found", "run fsdpctl submit on a machine that can submit Slurm jobs")
    try:
        # max_num_timeout: requeue as often as the time limit comes, like the batch script does.
        executor = submitit.SlurmExecutor(folder=folder, python=python, max_num_timeout=1_000_000)
        executor.update_parameters(**params)
        job = executor.submit(task)
    except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError) as exc:
        detail = last_line(getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc), "no answer")
        raise FsdpctlError(f"sbatch (through submitit) refused the job: {detail}",
                           "check the profile's slurm section and sinfo") from None
    return str(job.job_id)
