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


def collectives_result(lines: Sequence[str]) -> dict[str, Any] | None:
    """Rank 0's result line of the collective smoke test, with the transports NCCL reported."""
    result = None
    transports: set[str] = set()
    for line in lines:
        if (at := line.find(COLLECTIVES_PREFIX)) >= 0:
            try:
                result = json.loads(line[at + len(COLLECTIVES_PREFIX):])
            except ValueError:
                continue
        transports.update(_NCCL_TRANSPORT.findall(line))
    if result is not None:
        if result.get("backend") == "gloo":
            result["transport"] = ["gloo/TCP"]
        else:
            result["transport"] = sorted(transports) or ["unknown (no NCCL transport line seen)"]
    return result
