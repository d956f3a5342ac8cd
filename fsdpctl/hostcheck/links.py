"""The link check (``doctor --links``): reading its result line, judging it, drawing it.

``fsdpctl.workload.links`` measures every pair of nodes; global rank 0 prints one JSON line. This
module runs in the CLI and never imports torch (matplotlib only inside :func:`plot_matrix`).

The rule, which holds against noisy but even links and names a throttled node:

* the reference is the median over nodes of each node's median pair bandwidth: one slow node drags
  its own median down but only one of the n medians, and every other node's median over n-1 pairs
  sees that node once, so a minority of slow nodes leaves the reference at the healthy speed;
* a pair is slow when its bandwidth is below half the reference: with timing jitter under +-33% on
  even links the slowest pair is above (1-j) and the reference below (1+j) of the true speed, so no
  pair can be slow; a link running at half speed or worse is;
* a node is named as the slow link when at least half of its pairs are slow and it is in more slow
  pairs than the median node: a throttled node is in all n-1 of its pairs, a healthy one only in
  its pairs with throttled nodes. So two nodes whose only slow pair is with each other are not
  named (either could be at fault; the pair is), and two throttled nodes among eight are both named;
* a pair that reads slow is measured again at once, alone on the links, and held to the better of
  its two readings: a pair is named only when the second reading confirms it (its line says both), so
  a moment of load on a busy machine or network names nobody;
* with 2 nodes there is one pair and nothing to compare it with: nothing is judged slow, and the
  text says to compare the figure with the link's rated speed. Likewise when half the nodes or more
  are throttled the cluster looks even, at the lower speed: the reference is printed for that check.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..workload.link_rule import SLOW_RATIO, bandwidths, reference, slow_pairs

LINKS_MODULE = "fsdpctl.workload.links"
LINKS_PREFIX = "fsdpctl.links: "


@dataclass
class LinkVerdict:
    """The judgement of one link check.

    ``slow_pairs``: (a, b, gbps, ratio to the reference) per slow pair; ``slow_nodes``: (node,
    reason) per node named as the slow link; ``text``: the lines to show.
    """

    slow_pairs: list[tuple[int, int, float, float]] = field(default_factory=list)
    slow_nodes: list[tuple[int, str]] = field(default_factory=list)
    reference_gbps: float | None = None
    text: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no pair is slow."""
        return not self.slow_pairs


def links_result(lines: Sequence[str]) -> dict[str, Any] | None:
    """Rank 0's result line of the link check, found anywhere in a line (the last one wins)."""
    from .collectives import result_line

    return result_line(lines, LINKS_PREFIX, "pairs")


def _hosts(result: dict[str, Any]) -> list[str]:
    nodes = sorted(result.get("nodes", []), key=lambda node: node["node"])
    return [str(node.get("host", f"node{node['node']}")) for node in nodes]


def _bandwidths(result: dict[str, Any]) -> dict[tuple[int, int], float]:
    """(lower node, higher node) -> GB/s per direction, a pair measured again at its better reading."""
    return bandwidths([*result.get("pairs", []), *result.get("again", [])])


def _readings(result: dict[str, Any]) -> dict[tuple[int, int], list[float]]:
    """Each pair measured again: its readings, first and again."""
    first = bandwidths(result.get("pairs", []))
    again = bandwidths(result.get("again", []))
    return {pair: [first[pair], g] for pair, g in again.items() if pair in first}


def _slow_nodes(n: int, slow: list[tuple[int, int, float, float]], gbps: dict[tuple[int, int], float],
                reference: float, readings: dict[tuple[int, int], list[float]]) -> list[tuple[int, str]]:
    counts = [sum(i in (a, b) for a, b, _, _ in slow) for i in range(n)]
    typical = statistics.median(counts)
    named = []
    for i in range(n):
        pairs = [g for pair, g in gbps.items() if i in pair]
        if pairs and 2 * counts[i] >= len(pairs) and counts[i] > typical:
            mine = [(a, b) for a, b, _, _ in slow if i in (a, b)]
            twice = "; each measured twice" if all(pair in readings for pair in mine) else ""
            reason = (f"{counts[i]} of its {len(pairs)} pairs are slow{twice}, median {statistics.median(pairs):.2f} "
                      f"GB/s against the {reference:.2f} GB/s reference")
            named.append((i, reason))
    return named


def judge_links(result: dict[str, Any]) -> LinkVerdict:
    """Find the slow pairs and the nodes whose link is slow (the rule is in the module docstring)."""
    hosts, gbps = _hosts(result), _bandwidths(result)
    n = len(hosts)
    head = (f"links: {n} node(s), {len(gbps)} pair(s) in {result.get('rounds', 0)} round(s), "
            f"{_size(result.get('bytes', 0))} x {result.get('iters', 0)} each way ({result.get('backend', '?')})")
    if not gbps:
        return LinkVerdict(text=[head, "no pair of nodes to measure: a link check needs 2 nodes or more"])
    ref = reference(n, gbps)
    verdict = LinkVerdict(reference_gbps=ref, text=[head])
    if len(gbps) == 1:
        verdict.text.append(f"one pair, {ref:.2f} GB/s per direction: nothing to compare it with, so no "
                            "node is judged; compare it with the link's rated speed")
        return verdict
    verdict.slow_pairs = slow_pairs(n, gbps)
    readings = _readings(result)
    verdict.slow_nodes = _slow_nodes(n, verdict.slow_pairs, gbps, ref, readings)
    low, high = min(gbps.values()), max(gbps.values())
    verdict.text.append(f"reference {ref:.2f} GB/s per direction (pairs {low:.2f} to {high:.2f})")
    for i, reason in verdict.slow_nodes:
        verdict.text.append(f"slow link: node {i} ({hosts[i]}): {reason}")
    named = {i for i, _ in verdict.slow_nodes}
    for a, b, g, ratio in verdict.slow_pairs:
        if a not in named and b not in named:
            verdict.text.append(f"slow pair: node {a} ({hosts[a]}) <-> node {b} ({hosts[b]}): "
                                f"{g:.2f} GB/s, {ratio:.2f} of the reference{_twice(readings.get((a, b)))}")
    slow = {(a, b) for a, b, _, _ in verdict.slow_pairs}
    for (a, b), (first, again) in sorted(readings.items()):
        if (a, b) not in slow:
            verdict.text.append(f"measured again: node {a} ({hosts[a]}) <-> node {b} ({hosts[b]}) read {first:.2f} "
                                f"GB/s, then {again:.2f} GB/s: not slow (the first reading was noise)")
    if not verdict.slow_pairs:
        verdict.text.append(f"all {len(gbps)} pairs within {SLOW_RATIO:.0%} of the reference: the links look even")
    return verdict


def _twice(readings: list[float] | None) -> str:
    if not readings:
        return ""
    return f" (measured twice: {readings[0]:.2f} and {readings[1]:.2f} GB/s)"


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale and count % scale == 0:
            return f"{count // scale} {unit}"
    return f"{count} bytes"


def _cell(value: float | None, slow: bool) -> str:
    if value is None:
        return "?"
    return (f"{value:.1f}" if value >= 100 else f"{value:.2f}") + ("*" if slow else "")


def matrix_lines(result: dict[str, Any]) -> list[str]:
    """An n x n text matrix of GB/s per direction, hosts as labels; ``*`` marks a slow pair."""
    hosts, gbps = _hosts(result), _bandwidths(result)
    slow = {(a, b) for a, b, _, _ in judge_links(result).slow_pairs}
    n = len(hosts)
    rows = [["-" if i == j else _cell(gbps.get((min(i, j), max(i, j))), (min(i, j), max(i, j)) in slow)
             for j in range(n)] for i in range(n)]
    # Long host names would make every column wide: columns show at most 12 characters of them.
    labels = [host if len(host) <= 12 else host[:11] + "~" for host in hosts]
    width = max([7, *(len(label) for label in labels), *(len(cell) for row in rows for cell in row)])
    left = max([4, *(len(host) for host in hosts)])
    lines = ["GB/s".ljust(left) + "".join(f" {label:>{width}}" for label in labels)]
    for host, row in zip(hosts, rows, strict=True):
        lines.append(host.ljust(left) + "".join(f" {cell:>{width}}" for cell in row))
    if slow:
        lines.append(f"* below {SLOW_RATIO:.0%} of the reference")
    return lines


def plot_matrix(result: dict[str, Any], directory: Path) -> Path:
    """Write ``links.png``, a heat map of GB/s per pair (slow pairs marked ``*``), into ``directory``."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("doctor --plot: matplotlib is not installed here",
                         "pip install 'fsdpctl[report]' (or matplotlib), or leave out --plot") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    hosts, gbps = _hosts(result), _bandwidths(result)
    slow = {(a, b) for a, b, _, _ in judge_links(result).slow_pairs}
    n = len(hosts)
    grid = [[gbps.get((min(i, j), max(i, j)), float("nan")) if i != j else float("nan") for j in range(n)]
            for i in range(n)]
    side = min(14.0, 3.0 + 0.6 * n)
    fig, ax = plt.subplots(figsize=(side + 1.5, side))
    # From 0, so the colours show how far a slow pair falls, not just the spread.
    image = ax.imshow(grid, interpolation="nearest", cmap="viridis", vmin=0)
    fig.colorbar(image, ax=ax, label="GB/s per direction")
    ax.set_xticks(range(n), hosts, rotation=90)
    ax.set_yticks(range(n), hosts)
    if n <= 24:  # more cells than this and the numbers no longer fit
        for (a, b), g in gbps.items():
            for i, j in ((a, b), (b, a)):
                colour = "black" if image.norm(g) > 0.6 else "white"  # readable on viridis' yellows too
                ax.text(j, i, _cell(g, (a, b) in slow), ha="center", va="center", fontsize=8, color=colour)
    ax.set_title(f"Link bandwidth per node pair ({result.get('backend', '?')}, * slow)")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "links.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"fsdpctl:figure": "links", "fsdpctl:series": str(n)})
    plt.close(fig)
    return path
