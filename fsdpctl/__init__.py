"""fsdpctl: launch FSDP/FSDP2 training on many nodes, checked before it starts.

The Python API (``fsdpctl.launch``, ``fsdpctl.submit``, ``fsdpctl.hostcheck``, ``fsdpctl.get_run``,
``fsdpctl.runs``, ``fsdpctl.load_profile``, ``fsdpctl.Run``...) lives in ``fsdpctl.api`` and loads on
first use, so ``import fsdpctl`` costs almost nothing and pulls in no third-party library (this file
also goes to the nodes, where only the workload is). Type checkers read ``__init__.pyi``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.3.0"

PUBLIC_NAMES = (
    "AttemptInfo", "AttemptStarting", "Event", "Failure", "Fetched", "FsdpctlError", "HostChecked", "HostError",
    "JobOptions", "LogLine", "LogLines", "NodeState", "NodeStatus", "Notice", "Outcome", "PreflightError",
    "PreflightFailed", "PreflightStarted", "Prepared", "ProfileError", "ProfileNotFound", "Run", "RunEnded",
    "RunInfo", "RunStarted", "RunState", "RunStatus", "StackReport", "UsageError", "WaitTimeout", "doctor",
    "get_run", "launch", "load_profile", "prepare", "runs", "submit", "init_profile", "InitResult", "InitRefused",
    "estimate", "EstimateReport", "report", "Report", "hosts", "HostInfo", "watch", "Snapshot", "goodput",
    "GoodputReport", "HangSuspected",
)
"""What ``fsdpctl.api`` offers as ``fsdpctl.<name>``."""

__all__ = ["__version__", *PUBLIC_NAMES]


def __getattr__(name: str) -> Any:
    if name in PUBLIC_NAMES:
        value = getattr(importlib.import_module("fsdpctl.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fsdpctl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC_NAMES})
