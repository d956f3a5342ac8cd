"""The straggler rule: which rank's compute stands out from the others', window after window.

Pure Python (no torch): the workload applies it as it runs, and ``fsdpctl report`` applies it again
to ``metrics.jsonl``. In a window, a rank is slow when its compute time is at least ``RATIO`` times
the median of the other ranks' and at least ``FLOOR_S`` seconds more (tiny steps jitter by more than
10 %). A rank is named when it was slow in at least ``SHARE`` of the windows, at least ``MIN_WINDOWS``
of them: one noisy window never names anybody. When every rank of a node is named, the node is.
On the namespace testbed (tests/integration/test_report.py) an even run's slowest rank computed 1.03x
the median; a rank sharing its core with a busy process 1.75x; the rule's false alarms are tested on
jittered windows in tests/unit/test_straggler.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

RATIO = 1.10
FLOOR_S = 0.002
SHARE = 0.6
MIN_WINDOWS = 3

WHY = ("a slower or throttled device (clocks, power or thermal limits), another job or process on the same "
       "node, or a CPU/NUMA placement that differs from the other ranks'")


def slow_ranks(computes: Sequence[float]) -> dict[int, float]:
    """In one window: the ranks whose compute stands out, with their ratio to the others' median."""
    out: dict[int, float] = {}
    count = len(computes)
    if count < 2:
        return out
    order = sorted(range(count), key=computes.__getitem__)
    ranked = [computes[r] for r in order]

    def others_at(position: int, skip: int) -> float:  # the position-th of the sorted list without skip
        return ranked[position if position < skip else position + 1]

    half = (count - 1) // 2
    for skip, rank in enumerate(order):  # the median of the others, without sorting them again
        others = (others_at(half, skip) if (count - 1) % 2 else
                  (others_at(half - 1, skip) + others_at(half, skip)) / 2)
        mine = computes[rank]
        if mine >= RATIO * others and mine - others >= FLOOR_S:
            out[rank] = mine / others if others > 0 else float("inf")
    return out


class Tally:
    """The rule applied window by window (the workload keeps one as it runs; cost per window: one
    pass over the ranks)."""

    def __init__(self) -> None:
        self.seen = 0
        self.slow: dict[int, list[float]] = {}
        self.where: dict[int, Mapping[str, Any]] = {}

    def add(self, ranks: Sequence[Mapping[str, Any]]) -> None:
        """One window: an entry per rank with ``compute_s`` (and ``node``, ``host`` where known)."""
        if len(ranks) < 2 or any(r.get("compute_s") is None for r in ranks):
            return
        self.seen += 1
        for rank, entry in enumerate(ranks):
            self.where[rank] = entry
        for rank, ratio in slow_ranks([float(r["compute_s"]) for r in ranks]).items():
            self.slow.setdefault(rank, []).append(ratio)

    def verdict(self) -> Optional[dict[str, Any]]:
        """The straggler named so far, or None when no rank stands out: ``rank``, ``node``, ``host``,
        ``ratio`` (median over the windows it was slow in), ``windows_slow``, ``windows``, ``ranks``
        (every rank named), ``whole_node`` (the node when all of its ranks are named) and ``text``."""
        if self.seen < MIN_WINDOWS:
            return None
        named = sorted(r for r, ratios in self.slow.items() if len(ratios) >= max(MIN_WINDOWS, SHARE * self.seen))
        if not named:
            return None
        worst = max(named, key=lambda r: median_of(self.slow[r]))
        info = self.where.get(worst, {})
        ratio = median_of(self.slow[worst])
        nodes_named = {self.where.get(r, {}).get("node") for r in named}
        whole_node = None
        if len(nodes_named) == 1 and None not in nodes_named:
            node = next(iter(nodes_named))
            on_node = sorted(r for r, e in self.where.items() if e.get("node") == node)
            if len(on_node) > 1 and on_node == named:
                whole_node = node
        place = f" on {info['host']}" if info.get("host") else ""
        node_text = f" (node {info['node']})" if info.get("node") is not None else ""
        who = (f"node {whole_node}{place}, all {len(named)} of its ranks," if whole_node is not None
               else f"rank {worst}{place}{node_text}")
        text = (f"straggler: {who} computed {ratio:.2f}x the other ranks' median in {len(self.slow[worst])} "
                f"of {self.seen} windows; every rank waits for it at each collective. Usually {WHY}.")
        local = [self.where[r].get("local_rank") for r in named
                 if self.where.get(r, {}).get("host") == info.get("host")]
        return {"rank": worst, "node": info.get("node"), "host": info.get("host"), "ratio": round(ratio, 3),
                "windows_slow": len(self.slow[worst]), "windows": self.seen, "ranks": named,
                "local_ranks": [r for r in local if r is not None], "whole_node": whole_node, "text": text}


def verdict(windows: Iterable[Sequence[Mapping[str, Any]]]) -> Optional[dict[str, Any]]:
    """``Tally``'s verdict over ``windows``."""
    tally = Tally()
    for ranks in windows:
        tally.add(ranks)
    return tally.verdict()


def spread_of(ranks: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """One window's spread of compute: the slowest rank's over the median (None: not measured)."""
    computes = [float(r["compute_s"]) for r in ranks if r.get("compute_s") is not None]
    if len(computes) >= 2 and min(computes) > 0:
        return max(computes) / statistics.median(computes)
    return None


def median_of(values: Any) -> float:
    """The median of a sequence of numbers, or of a run's values kept in bounded memory (an object with
    its own ``median()``: ``fsdpctl.metrics.quantiles.Values``)."""
    own = getattr(values, "median", None)
    return own() if callable(own) else statistics.median(values)


def even_text_from(spreads: Sequence[float]) -> Optional[str]:
    """``even_text`` from the windows' spreads (``spread_of`` each, None left out; or their ``Values``)."""
    if not spreads:
        return None
    return f"ranks even: the slowest rank's compute was {median_of(spreads):.2f}x the median (median window)"


def even_text(windows: Sequence[Sequence[Mapping[str, Any]]]) -> Optional[str]:
    """What to say when nobody stands out: the spread of compute across ranks (None: not measured)."""
    return even_text_from([s for ranks in windows if (s := spread_of(ranks)) is not None])
