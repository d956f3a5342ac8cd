"""The public Python surface of fsdpctl (what ``import fsdpctl`` gives), which the CLI stands on.

It orchestrates a run: the preflight, the run directory, the start, following it with the hang
watchdog, restarts, fetching files. It reports progress as events (``events``) and never prints;
failures a user can act on are ``FsdpctlError`` exceptions, each with its hint.
"""

# ruff: noqa: F401 - the names below are re-exported: ``__all__`` is fsdpctl.PUBLIC_NAMES (a test keeps the two equal)
from __future__ import annotations

from .. import PUBLIC_NAMES
from ..diagnose.stacks import StackReport
from ..errors import FsdpctlError, HostError, PreflightError, ProfileError, ProfileNotFound, UsageError, WaitTimeout
from ..job import JobOptions
from ..live.snapshot import Snapshot
from ..rundir.lines import LogLine
from ..rundir.state import Failure, NodeState, Outcome, RunState
from ..rundir.status import AttemptInfo, NodeStatus, RunStatus
from .doctor import doctor
from .estimate import EstimateReport, estimate
from .events import (
    AttemptStarting,
    Event,
    Fetched,
    HostChecked,
    Notice,
    PreflightFailed,
    PreflightStarted,
    RunEnded,
    RunStarted,
)
from .hosts import HostInfo, hosts
from .init import InitRefused, InitResult, init_profile
from .launching import launch, prepare, submit
from .prepare import Prepared, load_profile
from .registry import get_run, runs
from .report import Report, report
from .run import LogLines, Run, RunInfo
from .watching import watch

__all__ = list(PUBLIC_NAMES)
