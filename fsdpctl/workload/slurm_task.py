"""The callable that submitit runs on every node of a ``--via submitit`` job.

submitit starts one task per node (``srun ... python -m submitit.core._submit``), unpickles a
``NodeTask`` and calls it; the task runs the node's torchrun step, the same shell command
fsdpctl's own batch script gives ``srun``. Standard library only at import time: submitit and
the workload's torch stay out of the submitting process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .config import REQUEUE_MARKER


class NodeTask:
    """One node's share of the job; checkpointable, so submitit asks it before requeueing."""

    def __init__(self, step_command: str, run_dir: str, requeue: bool, save_seconds: float):
        self.step_command = step_command
        self.run_dir = run_dir
        self.requeue = requeue
        self.save_seconds = save_seconds
        self._pid: int | None = None

    def __call__(self) -> int:
        """Run the node's torchrun step; raises (submitit then reports the job failed) unless it exits 0."""
        if not self.requeue:
            # submitit always asks Slurm for SIGUSR2 ahead of the time limit and ends the job on it when
            # the task cannot requeue; without --requeue the run goes on to its limit instead.
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        if os.environ.get("SLURM_PROCID") == "0":
            # A marker left by an earlier attempt must not requeue this one before it has saved anything.
            (Path(self.run_dir) / REQUEUE_MARKER).unlink(missing_ok=True)
        proc = subprocess.Popen(["bash", "-c", self.step_command])
        self._pid = proc.pid
        code = proc.wait()
        if code != 0:
            raise RuntimeError(f"node {os.environ.get('SLURM_NODEID', '?')}: torchrun exited {code}; "
                               f"see node{os.environ.get('SLURM_NODEID', '')}.log in {self.run_dir}")
        return code

    def checkpoint(self, *args, **kwargs):
        """Called by submitit (on task 0, in its SIGUSR2 handler) before it requeues the job.

        The workers got the same SIGUSR2 and are saving; requeueing now would kill them mid-save,
        so wait for the marker the workload leaves once the checkpoint is complete. Returning None
        tells submitit not to requeue (nothing was saved in time)."""
        marker = Path(self.run_dir) / REQUEUE_MARKER
        deadline = time.monotonic() + self.save_seconds
        while not marker.exists() and time.monotonic() < deadline and not self._step_ended():
            time.sleep(0.2)
        if not marker.exists():
            return None
        from submitit.helpers import DelayedSubmission  # on the node, inside submitit's own task

        return DelayedSubmission(NodeTask(self.step_command, self.run_dir, self.requeue, self.save_seconds))

    def _step_ended(self) -> bool:
        # Not proc.poll(): the handler runs inside proc.wait(), which holds the Popen's wait lock.
        if self._pid is None:
            return True
        try:
            state = Path(f"/proc/{self._pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state in ("Z", "X")
