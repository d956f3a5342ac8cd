"""The collective smoke test (``doctor --collectives``): which module runs it and how its result is read.

It runs through the launch path like a training run; rank 0 prints one JSON line with the figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

COLLECTIVES_MODULE = "fsdpctl.workload.collectives"
COLLECTIVES_PREFIX = "fsdpctl.collectives: "
# NCCL says which transport carries its channels ("via NET/IB/0", "via NET/Socket/1", "via P2P/IPC").
_NCCL_TRANSPORT = re.compile(r"via (NET/IB|NET/Socket|P2P|SHM|NVLS|CollNet)")
COLLECTIVES_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def result_line(lines: Sequence[str], prefix: str, key: str) -> dict[str, Any] | None:
    """The last result line of one of doctor's measured checks (``<prefix>{json}``, wherever it
    sits in a line: torchrun's ``[rank0]:`` prefix and the like are skipped) whose object has ``key``."""
    result = None
    for line in lines:
        if (at := line.find(prefix)) >= 0:
            try:
                found = json.loads(line[at + len(prefix):])
            except ValueError:
                continue
            if isinstance(found, dict) and key in found:
                result = found
    return result


def collectives_result(lines: Sequence[str]) -> dict[str, Any] | None:
    """Rank 0's result line of the collective smoke test, with the transports NCCL reported."""
    result = result_line(lines, COLLECTIVES_PREFIX, "results")
    transports = {t for line in lines for t in _NCCL_TRANSPORT.findall(line)}
    if result is not None:
        if result.get("backend") == "gloo":
            result["transport"] = ["gloo/TCP"]
        else:
            result["transport"] = sorted(transports) or ["unknown (no NCCL transport line seen)"]
    return result
