"""The public Python surface of fsdpctl (what ``import fsdpctl`` gives), which the CLI stands on.

It orchestrates a run: the preflight, the run directory, the start, following it with the hang
watchdog, restarts, fetching files. It reports progress as events (``events``) and never prints;
failures a user can act on are ``FsdpctlError`` exceptions, each with its hint.

Each name loads its module on first use: ``fsdpctl runs`` pays for the registry, not for the
estimator, the doctor or the live views.
"""

# ruff: noqa: F401 - the names below are re-exported: ``__all__`` is fsdpctl.PUBLIC_NAMES (a test keeps the two equal)
from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from .. import PUBLIC_NAMES

if TYPE_CHECKING:
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
        HangSuspected,
        HostChecked,
        Notice,
        PreflightFailed,
        PreflightStarted,
        RunEnded,
        RunStarted,
    )
    from .goodput import GoodputReport, goodput
    from .hosts import HostInfo, hosts
    from .init import InitRefused, InitResult, init_profile
    from .launching import launch, prepare, submit
    from .prepare import Prepared, load_profile
    from .registry import get_run, runs
    from .report import Report, report
    from .run import LogLines, Run, RunInfo
    from .watching import watch

_MODULES = {
    "fsdpctl.diagnose.stacks": ("StackReport",),
    "fsdpctl.errors": ("FsdpctlError", "HostError", "PreflightError", "ProfileError", "ProfileNotFound", "UsageError",
                       "WaitTimeout"),
    "fsdpctl.job": ("JobOptions",),
    "fsdpctl.live.snapshot": ("Snapshot",),
    "fsdpctl.rundir.lines": ("LogLine",),
    "fsdpctl.rundir.state": ("Failure", "NodeState", "Outcome", "RunState"),
    "fsdpctl.rundir.status": ("AttemptInfo", "NodeStatus", "RunStatus"),
    "fsdpctl.api.doctor": ("doctor",),
    "fsdpctl.api.estimate": ("EstimateReport", "estimate"),
    "fsdpctl.api.events": ("AttemptStarting", "Event", "Fetched", "HangSuspected", "HostChecked", "Notice",
                           "PreflightFailed", "PreflightStarted", "RunEnded", "RunStarted"),
    "fsdpctl.api.goodput": ("GoodputReport", "goodput"),
    "fsdpctl.api.hosts": ("HostInfo", "hosts"),
    "fsdpctl.api.init": ("InitRefused", "InitResult", "init_profile"),
    "fsdpctl.api.launching": ("launch", "prepare", "submit"),
    "fsdpctl.api.prepare": ("Prepared", "load_profile"),
    "fsdpctl.api.registry": ("get_run", "runs"),
    "fsdpctl.api.report": ("Report", "report"),
    "fsdpctl.api.run": ("LogLines", "Run", "RunInfo"),
    "fsdpctl.api.watching": ("watch",),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
"""Each public name -> the module that defines it."""

__all__ = list(PUBLIC_NAMES)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'fsdpctl.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC_NAMES})


class _Api(types.ModuleType):
    """Importing a submodule binds it on this package under its name: where a public name is also a
    submodule's (``doctor``, ``estimate``, ``hosts``, ``report``, ``prepare``), the name keeps meaning
    the public object (``__getattr__`` finds it)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and name in _WHERE:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Api
