"""The estimate's trace in a Python process of its own, and its answers: the one place that starts
``python -m fsdpctl.workload.estimate`` and reads what it prints. Standard library only: the
launcher starts it on this machine (it never imports torch), and a rank of the workload starts it
beside its run (the trace needs a fake process group, and a rank has a real one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

PREFIX = "fsdpctl.estimate"
"""What starts each answer line: ``fsdpctl.estimate: {json}``."""
MODULE = "fsdpctl.workload.estimate"


def trace_in_process(requests: Any, timeout: float, path: Sequence[str]) -> subprocess.CompletedProcess:
    """Trace ``requests`` (one configuration or a list) with this Python, ``path`` first on its
    PYTHONPATH (where fsdpctl is). Raises subprocess.TimeoutExpired."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", MODULE, json.dumps(requests)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def answers(output: str) -> list[dict[str, Any]]:
    """Every answer the trace printed, in order."""
    head = f"{PREFIX}: "
    return [json.loads(line[len(head):]) for line in output.splitlines() if line.startswith(head)]
