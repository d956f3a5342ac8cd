"""Where each minute of a run went: the account's partition of time, cut into equal buckets over the
run (a minute each for a run of up to two hours; shorter buckets for a shorter run, longer ones for a
longer run, never more than ``MAX_BUCKETS``), each bucket's seconds by category. The dashboard draws
it as a strip of stacked columns under the account."""

from __future__ import annotations

import math
from typing import Optional

MAX_BUCKETS = 120
_SIZES = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 28800, 86400)
"""Bucket lengths in seconds, the shortest that keeps a run in ``MAX_BUCKETS`` chosen."""


def bucket_s(wall_s: float) -> float:
    """The bucket length for a run of ``wall_s`` seconds."""
    for size in _SIZES:
        if wall_s <= size * MAX_BUCKETS:
            return float(size)
    return float(math.ceil(wall_s / MAX_BUCKETS / 86400) * 86400)


class Minutes:
    """Buckets of seconds by category over [begin, begin + wall), filled segment by segment."""

    def __init__(self, begin: float, wall_s: float):
        self.begin, self.size = begin, bucket_s(wall_s)
        self.buckets: list[dict[str, float]] = [{} for _ in range(max(1, math.ceil(wall_s / self.size)))]

    def add(self, at: float, until: float, shares: dict[str, float]) -> None:
        """The seconds from ``at`` to ``until`` into their buckets, split by ``shares`` (summing to 1)."""
        while until > at:
            index = min(len(self.buckets) - 1, max(0, int((at - self.begin) // self.size)))
            edge = min(until, self.begin + (index + 1) * self.size)
            if index == len(self.buckets) - 1:
                edge = until
            span = edge - at
            bucket = self.buckets[index]
            for name, share in shares.items():
                if share > 0:
                    bucket[name] = bucket.get(name, 0.0) + span * share
            at = edge

    def to_json(self) -> dict:
        return {"bucket_s": self.size,
                "buckets": [{k: round(v, 2) for k, v in b.items() if round(v, 2) > 0} for b in self.buckets]}


def step_shares(split: dict[str, float]) -> Optional[dict[str, float]]:
    """A window's split of its kept seconds (warm-up, data and collective wait, productive) as shares."""
    total = sum(split.values())
    return {k: v / total for k, v in split.items()} if total > 0 else None
