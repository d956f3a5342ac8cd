"""``--via submitit``: submitit's Slurm executor writes and submits its own batch script, which starts
one submitit task per node; each task runs the node's step command (fsdpctl.workload.slurm_task).
submitit is imported here only, and only for such a submission.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from ...errors import FsdpctlError, UsageError
from .client import last_line
from .plan import time_limit_minutes

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


@contextlib.contextmanager
def _environment(extra: dict[str, str]):
    """``extra`` in os.environ while the block runs, then the environment as it was; files written
    meanwhile (submitit's folder) are this user's only, and so is the job's umask (Slurm passes it on)."""
    before = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    umask = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(umask)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
    """Copy submitit and its pure-Python dependencies into the run's ``pkg``: a node needs nothing
    more than for the other ways of running, and runs the submitter's version."""
    import importlib

    _import_submitit()
    for name in SUBMITIT_PACKAGES:
        source = Path(importlib.import_module(name).__file__)  # type: ignore[arg-type]
        # Copied without their modes: what fsdpctl puts in a run directory is its owner's alone.
        if source.name == "__init__.py":
            shutil.copytree(source.parent, Path(pkg_dir) / name, dirs_exist_ok=True, copy_function=shutil.copyfile,
                            ignore=shutil.ignore_patterns("__pycache__", "test_*.py", "conftest.py"))
            for folder in [Path(pkg_dir) / name, *(p for p in (Path(pkg_dir) / name).rglob("*") if p.is_dir())]:
                folder.chmod(0o700)
        else:
            shutil.copyfile(source, Path(pkg_dir) / source.name)


def submit_with_submitit(folder: str, python: str, params: dict[str, object], task: object,
                         secrets: dict[str, str] | None = None) -> str:
    """Submit ``task`` (one per node) through submitit's SlurmExecutor; returns the job id. submitit
    runs sbatch with this process's environment: ``secrets`` are in it for the submission only."""
    submitit = _import_submitit()
    if shutil.which("srun") is None or shutil.which("sbatch") is None:
        raise UsageError("srun/sbatch not found", "run fsdpctl submit on a machine that can submit Slurm jobs")
    try:
        # max_num_timeout: requeue as often as the time limit comes, like the batch script does.
        executor = submitit.SlurmExecutor(folder=folder, python=python, max_num_timeout=1_000_000)
        executor.update_parameters(**params)
        with _environment(secrets or {}):
            job = executor.submit(task)
    except (subprocess.CalledProcessError, submitit.core.utils.FailedJobError) as exc:
        detail = last_line(getattr(exc, "stderr", None) or getattr(exc, "output", None) or str(exc), "no answer")
        raise FsdpctlError(f"sbatch (through submitit) refused the job: {detail}",
                           "check the profile's slurm section and sinfo") from None
    return str(job.job_id)
