"""A figure's values over a run in bounded memory, for the medians a report gives: exact while few,
then a quantile sketch with a stated error bound.

``Values`` keeps each value and its step while it holds at most ``EXACT`` of them: its median is then
``statistics.median``'s, and a resume that goes back into them (``cut_to``) drops exactly the values
past the step. Past ``EXACT`` it becomes a DDSketch (Masson, Rim and Lee, VLDB 2019): each value
counts in the bucket ``ceil(log_gamma |v|)`` of its sign, gamma = (1 + ALPHA) / (1 - ALPHA), and a
quantile is read as the mean of its bucket's values (each bucket keeps their count and sum). Any two
values of a bucket are within gamma - 1 (``ERROR``, 0.2 %) of each other, so that mean is within
``ERROR`` of the exact value at that rank (DDSketch's bucket middle would be within ALPHA, half that;
the mean gives a steady figure back as it was). A median of an even count is the mean of two such
values, so it too is within ``ERROR`` of the exact median (values of one sign). The buckets a figure
fills grow with the log of its range, not with the run: a figure that moves within 2x of itself fills
about 350 of them.

A sketch cut by a resume keeps the share of its counts that its steps before the cut had (``cut_to``):
exact where the figure was steady over those steps, and outside the bound otherwise. Consecutive
``Values`` merge (``merged``) as the chunks that hold them do (``fsdpctl.metrics.step_chunks``).

Each ``Values`` also keeps its lowest value and its newest (with their steps), which a loss needs.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Optional

ALPHA = 0.001
"""DDSketch's relative accuracy: a bucket's middle is within it of every value in the bucket."""
GAMMA = (1 + ALPHA) / (1 - ALPHA)
ERROR = GAMMA - 1
"""The bound on any quantile read here, a median included (relative): 0.2 %."""
_LOG_GAMMA = math.log(GAMMA)
EXACT = 2048
"""Values kept one by one (with their steps) before the sketch takes over."""
TINY = 1e-12
"""Values of a smaller size count as zero in the sketch."""


def _key(size: float) -> int:
    return math.ceil(math.log(size) / _LOG_GAMMA)




class Values:
    """One figure's values, in step order within an attempt."""

    __slots__ = ("steps", "values", "positive", "negative", "zeros", "count", "low", "low_step", "newest",
                 "newest_step")

    def __init__(self) -> None:
        self.steps: Optional[array] = array("q")
        self.values: Optional[array] = array("d")
        """The values one by one (None once the sketch holds them)."""
        self.positive: dict[int, list[float]] = {}
        self.negative: dict[int, list[float]] = {}
        """Bucket -> [count, sum of its values' sizes], by sign."""
        self.zeros = 0.0
        self.count = 0.0
        self.low: Optional[float] = None
        self.low_step: Optional[int] = None
        self.newest: Optional[float] = None
        self.newest_step: Optional[int] = None

    @classmethod
    def of_steps(cls, steps: Sequence[int], values: Sequence[float]) -> Values:
        """Values at their steps, at most ``EXACT`` of them (a chunk's rows, in one pass)."""
        out = cls()
        out.steps.extend(steps)
        out.values.extend(values)
        out.count = float(len(values))
        if values:
            low = min(range(len(values)), key=values.__getitem__)
            out.low, out.low_step = values[low], steps[low]
            out.newest, out.newest_step = values[-1], steps[-1]
        return out

    def __len__(self) -> int:
        return int(round(self.count))

    @property
    def exact(self) -> bool:
        return self.values is not None

    def add(self, value: float, step: int = 0) -> None:
        """One value (at ``step``); the lowest is the first of equal ones, a NaN kept as ``min`` would."""
        self.count += 1
        if self.low is None or value < self.low:
            self.low, self.low_step = value, step
        self.newest, self.newest_step = value, step
        if self.values is not None:
            self.values.append(value)
            self.steps.append(step)
            if len(self.values) > EXACT:
                self._to_sketch()
        else:
            self._count(value, 1.0)

    def _count(self, value: float, weight: float) -> None:
        if value != value:  # NaN: no bucket holds it (a median of NaNs means nothing anyway)
            self.count -= weight
        elif abs(value) < TINY:
            self.zeros += weight
        else:
            buckets = self.positive if value > 0 else self.negative
            size = abs(value)
            bucket = buckets.get(_key(size))
            if bucket is None:
                buckets[_key(size)] = [weight, size * weight]
            else:
                bucket[0] += weight
                bucket[1] += size * weight

    def _to_sketch(self) -> None:
        values, self.values, self.steps = self.values, None, None
        for value in values:  # (counted already; _count takes a NaN back out)
            self._count(value, 1.0)

    def median(self) -> Optional[float]:
        """The median (None: no values): exact while the values are kept, else within ``ERROR``."""
        if self.values is not None:
            return statistics.median(self.values) if self.values else None
        if self.count <= 0:
            return None
        lower, upper = self._at((self.count - 1) / 2), self._at(self.count / 2)
        return (lower + upper) / 2

    def _at(self, rank: float) -> float:
        """The value at 0-based ``rank`` (rounded down) of the sorted values."""
        target, seen = math.floor(rank), 0.0
        for key in sorted(self.negative, reverse=True):
            count, total = self.negative[key]
            seen += count
            if seen > target:
                return -total / count
        seen += self.zeros
        if seen > target:
            return 0.0
        for key in sorted(self.positive):
            count, total = self.positive[key]
            seen += count
            if seen > target:
                return total / count
        if self.positive:
            count, total = self.positive[max(self.positive)]
            return total / count
        return 0.0

    def cut_to(self, step: int, share: float) -> None:
        """Keep the values up to ``step``: exactly while they are kept one by one; else ``share`` of
        the counts (the share of this chunk's steps kept)."""
        if self.values is not None:
            keep = next((i for i, s in enumerate(self.steps) if s > step), len(self.steps))
            values, steps = self.values[:keep], self.steps[:keep]
            self.__init__()
            for value, at in zip(values, steps, strict=True):
                self.add(value, at)
            return
        self.count *= share
        self.zeros *= share
        for buckets in (self.positive, self.negative):
            for bucket in buckets.values():
                bucket[0] *= share
                bucket[1] *= share
        if self.low_step is not None and self.low_step > step:
            self.low = self.low_step = None
        if self.newest_step is not None and self.newest_step > step:
            self.newest = self.newest_step = None

    @classmethod
    def merged(cls, parts: Sequence[Values]) -> Values:
        """Consecutive ``parts`` (oldest first) as one."""
        out = cls()
        if all(p.values is not None for p in parts) and sum(len(p.values) for p in parts) <= EXACT:
            for part in parts:
                out.values.extend(part.values)
                out.steps.extend(part.steps)
            out.count = float(len(out.values))
        else:
            out.values = out.steps = None
            for part in parts:
                if part.values is not None:
                    for value in part.values:
                        out._count(value, 1.0)
                    out.count += len(part.values)
                else:
                    out.zeros += part.zeros
                    for mine, theirs in ((out.positive, part.positive), (out.negative, part.negative)):
                        for key, (count, total) in theirs.items():
                            bucket = mine.get(key)
                            if bucket is None:
                                mine[key] = [count, total]
                            else:
                                bucket[0] += count
                                bucket[1] += total
        for part in parts:
            if part.values is None:
                out.count += part.count
            if part.low is not None and (out.low is None or part.low < out.low):
                out.low, out.low_step = part.low, part.low_step
            if part.newest_step is not None:
                out.newest, out.newest_step = part.newest, part.newest_step
        return out

    # ---- kept in the chart index -----------------------------------------------------------------
    def state(self, put: Callable[[array], int]) -> list[Any]:
        """Plain data, its arrays handed to ``put``."""
        if self.values is not None:
            return ["exact", put(self.steps), put(self.values), self.low, self.low_step, self.newest,
                    self.newest_step]
        keys = array("q", [*self.positive, *self.negative])
        weights = array("d", [v for bucket in (*self.positive.values(), *self.negative.values()) for v in bucket])
        return ["sketch", put(keys), put(weights), len(self.positive), self.zeros, self.count, self.low,
                self.low_step, self.newest, self.newest_step]

    @classmethod
    def of_state(cls, state: Sequence[Any], arrays: Sequence[array]) -> Values:
        out = cls()
        if state[0] == "exact":
            out.steps, out.values = array("q", arrays[state[1]]), array("d", arrays[state[2]])
            out.count = float(len(out.values))
            out.low, out.low_step, out.newest, out.newest_step = state[3:7]
            return out
        keys, weights, positives = arrays[state[1]], arrays[state[2]], int(state[3])
        out.values = out.steps = None
        buckets = [[weights[2 * i], weights[2 * i + 1]] for i in range(len(keys))]
        out.positive = dict(zip((int(k) for k in keys[:positives]), buckets[:positives], strict=True))
        out.negative = dict(zip((int(k) for k in keys[positives:]), buckets[positives:], strict=True))
        out.zeros, out.count = float(state[4]), float(state[5])
        out.low, out.low_step, out.newest, out.newest_step = state[6:10]
        return out


def of(values: Iterable[float]) -> Values:
    """``Values`` holding ``values`` (steps 0, 1, ...)."""
    out = Values()
    for step, value in enumerate(values):
        out.add(value, step)
    return out


def merged_maps(maps: Sequence[Mapping[Any, Values]]) -> dict[Any, Values]:
    """Consecutive maps of ``Values`` (oldest first), key by key, keys in the order first seen."""
    keys: dict[Any, None] = {}
    for mapping in maps:
        keys.update(dict.fromkeys(mapping))
    return {key: Values.merged([m[key] for m in maps if key in m]) for key in keys}
