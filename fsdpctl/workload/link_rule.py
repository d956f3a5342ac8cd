"""The link check's rule for a slow pair, shared by the program that measures the links on the nodes
(``links``: which pairs to measure again) and the judge in the CLI (``fsdpctl.hostcheck.links``).
Standard library only: the CLI imports it without torch.

The reference is the median over nodes of each node's median pair bandwidth; a pair is slow below
``SLOW_RATIO`` of it (``fsdpctl.hostcheck.links`` says why this holds against jitter).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

SLOW_RATIO = 0.5
"""A pair below this fraction of the reference is slow."""


def bandwidths(pairs: Iterable[Mapping]) -> dict[tuple[int, int], float]:
    """(lower node, higher node) -> GB/s per direction, each pair at its better measurement (a pair
    measured again, ``again``, is held to the faster of its two: one slow reading under a passing load
    is noise, a link that is slow twice is slow)."""
    found: dict[tuple[int, int], float] = {}
    for pair in pairs:
        key = (min(pair["a"], pair["b"]), max(pair["a"], pair["b"]))
        found[key] = max(found.get(key, 0.0), float(pair["gbps"]))
    return found


def reference(n: int, gbps: Mapping[tuple[int, int], float]) -> float:
    per_node = [[g for pair, g in gbps.items() if i in pair] for i in range(n)]
    return statistics.median(statistics.median(values) for values in per_node if values)


def slow_pairs(n: int, gbps: Mapping[tuple[int, int], float]) -> list[tuple[int, int, float, float]]:
    """(a, b, GB/s, ratio to the reference) of every slow pair; none with fewer than two pairs (one
    pair has nothing to be compared with)."""
    if len(gbps) < 2:
        return []
    ref = reference(n, gbps)
    return sorted((a, b, g, g / ref) for (a, b), g in gbps.items() if g < SLOW_RATIO * ref)
