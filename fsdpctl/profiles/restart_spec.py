"""A profile's ``restart`` section: what a failed run is started again for (with ``max_restarts``);
and the signals a stop may give the ranks (``stop_signal``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, get_args

StopSignal = Literal["TERM", "INT", "HUP", "USR1"]
"""What a stop may give every rank first (a profile's ``stop_signal``, ``fsdpctl stop --signal``)."""
STOP_SIGNALS: tuple[str, ...] = get_args(StopSignal)

Cause = Literal["lost", "hang", "transport", "hardware", "signal", "program"]
CAUSES: tuple[Cause, ...] = ("lost", "hang", "transport", "hardware", "signal", "program")


@dataclass(frozen=True, kw_only=True)
class RestartSpec:
    """What ``max_restarts`` restarts a failed run for. A failure's cause is one of: ``lost`` (a node
    stopped answering), ``hang`` (the hang watchdog ended it), ``transport`` (a NCCL or gloo
    transport error, or a rank that only says a peer went away), ``hardware`` (a fault the health
    watch saw), ``signal`` (a rank killed from outside: SIGKILL, SIGTERM, SIGHUP, SIGINT, as the
    OOM killer or a preemption does) and ``program`` (any other error of the program). A program
    error that repeats the attempt before it (the same exit and last error line, at the same step
    where the steps are known) is never restarted: a restart would fail the same way."""

    causes: tuple[Cause, ...] = CAUSES
    """The causes that restart a run; a failure of any other cause ends it, saying why."""
    exit_codes: tuple[int, ...] = ()
    """Exit codes that always restart (a program's own "try me again", such as 75), repeated or not."""
    per_hour: Optional[int] = None
    """At most this many restarts in any hour of the run (unset: no hourly limit; ``max_restarts``
    still bounds them all)."""
