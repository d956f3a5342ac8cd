"""Leaving a detached run's follower behind: the process that collects a run nobody here follows
(``background`` is what it runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..rundir.rundir import RunDir

LOG = "follower.log"
"""Its own log, in the run's ``live/``: what it saw happen (hangs, the end), never the run's lines."""


def spawn_follower(run: RunDir) -> int:
    """Start the run's follower in the background (``python -m fsdpctl.api.background RUN_DIR``, a
    session of its own: no terminal's signals reach it); its pid."""
    from ..live.layout import live_dir
    from ..rundir.paths import private_dir

    folder = private_dir(live_dir(run.root))
    log = os.open(folder / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # The environment goes with it: the secrets' values to mask in the logs it keeps, SLURM_CONF.
        process = subprocess.Popen([sys.executable, "-m", "fsdpctl.api.background", str(run.root)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                   close_fds=True)
    finally:
        os.close(log)
    process.returncode = 0  # never waited for: it outlives this process on purpose
    return process.pid
