"""The compute check (``doctor --compute``): reading its result line and naming slow ranks.

``fsdpctl.workload.compute_check`` runs a timed matmul on every rank at once; rank 0 prints one
``fsdpctl.compute: {json}`` line with each rank's TFLOP/s. This module never imports torch: it
runs in the CLI process.

The rule: a rank is slow when its TFLOP/s is below ``RATIO`` (0.8) of the median over all ranks;
a node is slow when every one of its ranks is. The median, not the mean or the best, is the
yardstick: one broken GPU does not drag it down, and a lucky fast one does not raise it, so it
stays right while fewer than half the ranks are slow; when more are, the healthy ones stand out
above it instead (at 1 / 0.8 = 1.25x the median or more) and get a line saying most ranks may be
slow. With fewer than 2 ranks there is nothing to compare.

Why 0.8: identical GPUs running the same matmul differ by a few percent (clock boost, temperature,
silicon); with jitter of +-8% the worst pair is 0.92 / 1.08 = 0.85 of each other, so 0.8 never
names a healthy rank. The faults worth finding (thermal or power throttling, clocks locked low,
a GPU in a degraded state, another job on the GPU, a different SKU) cost 20% or more, and in
synchronous training every rank waits for the slowest: a rank at 0.8 slows the whole job by 20%.

Ranks whose device names differ (an A100 among H100s) get a line of their own: the slowest kind
sets the pace of the job even when each GPU is healthy.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

COMPUTE_MODULE = "fsdpctl.workload.compute_check"
COMPUTE_PREFIX = "fsdpctl.compute: "
RATIO = 0.8


@dataclass
class ComputeVerdict:
    """What the compute check found: the median, the slow ranks and nodes, and lines saying so."""

    median_tflops: float | None
    # (rank, host, local rank, TFLOP/s, ratio to the median)
    slow_ranks: list[tuple[int, str, int, float, float]] = field(default_factory=list)
    # (node, host) of the nodes whose every rank is slow
    slow_nodes: list[tuple[Any, str]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    mixed_hardware: bool = False

    @property
    def ok(self) -> bool:
        """True when no rank, node or device stands out."""
        return not self.slow_ranks and not self.mixed_hardware


def compute_result(lines: Sequence[str]) -> dict[str, Any] | None:
    """Rank 0's result line of the compute check (the last one, wherever it sits in a line:
    torchrun's ``[rank0]:`` prefix and the like are skipped), or None."""
    from .collectives import result_line

    result = result_line(lines, COMPUTE_PREFIX, "ranks")
    return result if result is not None and isinstance(result["ranks"], list) else None


def _rate(value: float, scale: float) -> str:
    """``760 TFLOP/s``; in GFLOP/s when ``scale`` is below 1 TFLOP/s (CPU runs), where TFLOP/s reads as 0."""
    if scale >= 100:
        return f"{value:.0f} TFLOP/s"
    return f"{value:.1f} TFLOP/s" if scale >= 1 else f"{value * 1e3:.1f} GFLOP/s"


def _rates(value: float, median: float) -> str:
    """``312 vs 760 TFLOP/s``."""
    return f"{_rate(value, median).split(' ')[0]} vs {_rate(median, median)}"


def _where(rank: dict, device: str) -> str:
    unit = "GPU" if device == "cuda" else "local rank"
    return f"{unit} {rank.get('local_rank', '?')} on {rank.get('host', '?')}"


def _mixed_lines(ranks: list[dict], device: str) -> list[str]:
    """A line per device name other than the most common one, naming its ranks."""
    names = Counter(str(r.get("device_name", "?")) for r in ranks)
    if len(names) < 2:
        return []
    common, count = names.most_common(1)[0]
    lines = []
    for name in sorted(set(names) - {common}):
        odd = [r for r in ranks if r.get("device_name") == name]
        shown = ", ".join(f"rank {r['rank']} ({_where(r, device)})" for r in odd[:4])
        more = f" and {len(odd) - 4} more" if len(odd) > 4 else ""
        lines.append(f"mixed hardware: {shown}{more} on {name}, {count} rank(s) on {common}; "
                     f"the slowest kind sets the pace of the job")
    return lines


def _slow_node_lines(ranks: list[dict], slow: set[int], median: float) -> tuple[list[tuple[Any, str]], list[str]]:
    """The nodes whose every rank is slow, and a line for each."""
    by_node: dict[Any, list[dict]] = {}
    for r in ranks:
        by_node.setdefault(r.get("node", r.get("host")), []).append(r)
    nodes, lines = [], []
    for node, members in by_node.items():
        if all(r["rank"] in slow for r in members):
            host = str(members[0].get("host", "?"))
            mean = sum(float(r["tflops"]) for r in members) / len(members)
            nodes.append((node, host))
            lines.append(f"node {node} ({host}): all {len(members)} rank(s) slow, at {mean / median:.2f}x the "
                         f"median ({_rates(mean, median)}): the node, not one GPU (power, cooling, clocks?)")
    return nodes, lines


def _fast_line(ranks: list[dict], median: float, device: str) -> list[str]:
    """A line when ranks beat the median by as much as a slow one trails it: with alike hardware
    that means most ranks are slow and the median with them, which the rule alone cannot see."""
    fast = [r for r in ranks if float(r["tflops"]) * RATIO > median]
    if not fast:
        return []
    best = max(float(r["tflops"]) for r in fast)
    shown = ", ".join(str(r["rank"]) for r in fast[:8]) + (f" and {len(fast) - 8} more" if len(fast) > 8 else "")
    return [f"rank(s) {shown} run up to {best / median:.2f}x the median ({_rates(best, median)}): "
            f"with alike {'GPUs' if device == 'cuda' else 'nodes'}, most ranks may be slow"]


def judge_compute(result: dict[str, Any]) -> ComputeVerdict:
    """Name the ranks below ``RATIO`` of the median, the nodes whose every rank is, and mixed hardware."""
    ranks = sorted(result.get("ranks") or [], key=lambda r: r["rank"])
    device = str(result.get("device", "cuda"))
    mixed = _mixed_lines(ranks, device)
    if not ranks:
        return ComputeVerdict(None, text=["no rank reported a compute figure"])
    median = statistics.median(float(r["tflops"]) for r in ranks)
    if len(ranks) < 2:
        only = ranks[0]
        return ComputeVerdict(median, text=[f"1 rank only ({_where(only, device)}, {_rate(median, median)}): "
                                            "nothing to compare it with"])
    if median <= 0:
        return ComputeVerdict(median, text=["no rank completed a matmul: nothing to compare"] + mixed,
                              mixed_hardware=bool(mixed))
    slow_ranks = [(int(r["rank"]), str(r.get("host", "?")), int(r.get("local_rank", 0)), float(r["tflops"]),
                   round(float(r["tflops"]) / median, 3))
                  for r in ranks if float(r["tflops"]) < RATIO * median]
    slow_nodes, text = _slow_node_lines(ranks, {s[0] for s in slow_ranks}, median)
    by_rank = {int(r["rank"]): r for r in ranks}
    for rank, _host, _local, tflops, ratio in slow_ranks:
        text.append(f"rank {rank} ({_where(by_rank[rank], device)}) at {ratio:.2f}x the median "
                    f"({_rates(tflops, median)})")
    text += mixed or _fast_line(ranks, median, device)
    if not text:
        text.append(f"all {len(ranks)} ranks at {RATIO}x the median or better (median {_rate(median, median)})")
    return ComputeVerdict(median, slow_ranks, slow_nodes, text, mixed_hardware=bool(mixed))


def table_lines(result: dict[str, Any]) -> list[str]:
    """One line per rank (host, local rank, device, TFLOP/s, ratio to the median), under a header."""
    ranks = sorted(result.get("ranks") or [], key=lambda r: r["rank"])
    if not ranks:
        return []
    median = statistics.median(float(r["tflops"]) for r in ranks)
    rows = [("rank", "host", "local", "device", "TFLOP/s", "x median", "")]
    for r in ranks:
        tflops = float(r["tflops"])
        ratio = f"{tflops / median:.2f}" if median > 0 else "-"
        flag = "slow" if median > 0 and tflops < RATIO * median else ""
        rows.append((str(r["rank"]), str(r.get("host", "?")), str(r.get("local_rank", "?")),
                     str(r.get("device_name", "?")), _tflops(tflops), ratio, flag))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    # Numbers line up on the right, names on the left.
    return ["  ".join(cell.rjust(widths[i]) if i in (4, 5) else cell.ljust(widths[i]) for i, cell in enumerate(row))
            .rstrip() for row in rows]


def _tflops(value: float) -> str:
    """Three significant figures whatever the scale: 760, 41.2, 0.0412."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"
