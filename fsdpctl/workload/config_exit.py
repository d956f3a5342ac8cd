"""How a rank of the bundled workload ends on a configuration error: exit 2, the error said by one
rank (local rank 0 of each node for an error met before the ranks talk; the lowest rank that met it
after)."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch.distributed as dist

from .config import ConfigError

PREFIX = "fsdpctl.workload"
SAYER_WAIT_SECONDS = 10.0


def config_exit(error: ConfigError | None) -> None:
    """Exit 2 after a configuration error that every rank met: ``error`` when this rank says it,
    None when another one does (local rank 0, or the lowest rank that raised it in ``agree``)."""
    if error is not None:
        print(f"{PREFIX}: {error}", file=sys.stderr, flush=True)
    grouped = dist.is_initialized()
    if grouped:  # every rank got here together (see parallelize.agree)
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
    if error is None:
        after_the_sayer()
    if grouped:
        os._exit(2)  # interpreter shutdown after gloo use can abort (see the end of train.run)
    sys.exit(2)


def after_the_sayer() -> None:
    """Under torchrun, a rank that does not say the error waits (up to SAYER_WAIT_SECONDS) for the
    one that does to exit first: torchrun stops every rank as soon as one exits, and a rank still on
    its way to the print was stopped before it (seen under CI's load: an error printed by nobody).
    torchrun's SIGTERM ends the wait, once the sayer has exited, with the default action."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the checkpoint-on-signal handler's note
    time.sleep(SAYER_WAIT_SECONDS)
