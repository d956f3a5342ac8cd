"""The straggler rule for ranks timed from outside the program (fsdpctl's rank telemetry), and which
rule a run's windows get.

In synchronous training every rank's step takes the same wall time: the others wait for the slow
rank in their collectives. So the slow rank is the one that waited least. In a window, the rank
that waited least is the culprit when it waited clearly less than the others (by at least
``GATE`` of a step, and ``FLOOR_S``); its cause is whichever of its input (the wait for batches)
or its compute exceeds the others' median by more. Where the time in collectives is not seen (DDP's
all-reduce runs in C++; NCCL without its timing), compute cannot be told from waiting, and only a
rank whose wait for data clearly exceeds the others' is named (cause: input). As with the compute
rule (``fsdpctl.workload.straggler``), a rank is named when it stood out in at least ``SHARE`` of
the windows and ``MIN_WINDOWS`` of them; an even run names nobody, and a run without a rank timed
this way gets the compute rule.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from ..workload.straggler import MIN_WINDOWS, SHARE, WHY, median_of
from ..workload.straggler import even_text as compute_even_text
from ..workload.straggler import verdict as compute_verdict

GATE = 0.10
"""Of a step's median wall time: how much less the culprit waited, or how much longer its input took."""
FLOOR_S = 0.002

UNSEEN = {"ddp": "DDP's gradient all-reduce runs in C++, out of fsdpctl's sight",
          "nccl-untimed": "NCCL's collectives are not timed (telemetry.nccl_timing)"}


def timed_from_outside(windows: Sequence[Sequence[Mapping[str, Any]]]) -> bool:
    return bool(windows) and all(e.get("timing") == "hook" for e in windows[-1])


def _median_others(values: Sequence[float], mine: int) -> float:
    return statistics.median(v for i, v in enumerate(values) if i != mine)


def window_culprit(ranks: Sequence[Mapping[str, Any]]) -> Optional[tuple[int, str, float]]:
    """(position in ``ranks``, ``input`` or ``compute``, seconds per step it stood out by) in one
    window, or None: nobody stands out, or a figure is missing."""
    if len(ranks) < 2 or any(not isinstance(e.get(k), (int, float)) for e in ranks for k in ("wall_s", "data_s")):
        return None
    wall = statistics.median(float(e["wall_s"]) for e in ranks)
    gate = max(GATE * wall, FLOOR_S)
    data = [float(e["data_s"]) for e in ranks]
    if all(isinstance(e.get("comm_s"), (int, float)) and isinstance(e.get("compute_s"), (int, float)) for e in ranks):
        comm = [float(e["comm_s"]) for e in ranks]
        least = min(range(len(ranks)), key=comm.__getitem__)
        waited_less = _median_others(comm, least) - comm[least]
        if waited_less < gate:
            return None
        compute = [float(e["compute_s"]) for e in ranks]
        more_input = data[least] - _median_others(data, least)
        more_compute = compute[least] - _median_others(compute, least)
        return least, "input" if more_input >= more_compute else "compute", waited_less
    most = max(range(len(ranks)), key=data.__getitem__)
    more_input = data[most] - _median_others(data, most)
    return (most, "input", more_input) if more_input >= gate else None


def wait_verdict(windows: Iterable[Sequence[Mapping[str, Any]]]) -> Optional[dict[str, Any]]:
    """The rank named over ``windows`` (each an entry per rank, in rank order), or None."""
    seen = 0
    flagged: dict[int, dict[str, list[float]]] = {}
    where: dict[int, Mapping[str, Any]] = {}
    for ranks in windows:
        if len(ranks) < 2:
            continue
        seen += 1
        for position, entry in enumerate(ranks):
            where[position] = entry
        found = window_culprit(ranks)
        if found is not None:
            flagged.setdefault(found[0], {}).setdefault(found[1], []).append(found[2])
    return wait_verdict_from(seen, flagged, where)


def wait_verdict_from(seen: int, flagged: Mapping[int, Mapping[str, Any]],
                      where: Mapping[int, Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """``wait_verdict`` from what its windows came to: how many were judged, each position's
    ``window_culprit`` findings in them (by cause, in the order first found: the seconds it stood out
    by, a list or ``Values``), and each position's newest entry."""
    if seen < MIN_WINDOWS:
        return None
    hits = {r: sum(len(by) for by in causes.values()) for r, causes in flagged.items()}
    named = sorted(r for r, count in hits.items() if count >= max(MIN_WINDOWS, SHARE * seen))
    if not named:
        return None
    worst = max(named, key=hits.__getitem__)
    info = where.get(worst, {})
    slow_in = max(flagged[worst], key=lambda kind: len(flagged[worst][kind]))  # the first found of equal ones
    by = median_of(flagged[worst][slow_in])
    wall = statistics.median(float(e["wall_s"]) for e in where.values())
    place = f" on {info['host']}" if info.get("host") else ""
    node_text = f" (node {info['node']})" if info.get("node") is not None else ""
    rank = info.get("rank", worst)
    if slow_in == "input":
        why = (f"its input: it waited {by:.3f} s a step longer than the other ranks for its batches"
               if not _comm_seen(where) else
               f"its input: it waited {by:.3f} s a step less than the other ranks in collectives, its batches "
               f"taking longer")
        usual = "Usually a slow dataset or storage on that node, too few data-loader workers, or a CPU it shares."
    else:
        why = (f"its compute: it waited {by:.3f} s a step less than the other ranks in collectives, computing "
               f"longer")
        usual = f"Usually {WHY}."
    text = (f"straggler: rank {rank}{place}{node_text}, slow in {why} (a step: {wall:.3f} s), in "
            f"{hits[worst]} of {seen} windows; every rank waits for it at each collective. {usual}")
    return {"rank": rank, "node": info.get("node"), "host": info.get("host"), "ratio": round((wall + by) / wall, 3)
            if wall > 0 else None, "windows_slow": hits[worst], "windows": seen,
            "ranks": [where[r].get("rank", r) for r in named], "local_ranks": [info["local_rank"]]
            if isinstance(info.get("local_rank"), int) else [], "whole_node": None, "slow_in": slow_in,
            "seconds_per_step": round(by, 6), "text": text}


def _comm_seen(where: Mapping[int, Mapping[str, Any]]) -> bool:
    return all(isinstance(e.get("comm_s"), (int, float)) for e in where.values())


def wait_even_text(windows: Sequence[Sequence[Mapping[str, Any]]]) -> Optional[str]:
    """What to say when nobody stands out, and what could not be judged."""
    if not windows:
        return None
    return wait_even_from(windows[-1], [g for ranks in windows if (g := wait_gap(ranks)) is not None])


def wait_gap(ranks: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """One window's gap: how much less than the others the rank that waited least waited in
    collectives, as a share of the step (None: not measured)."""
    comm = [float(e["comm_s"]) for e in ranks if isinstance(e.get("comm_s"), (int, float))]
    walls = [float(e["wall_s"]) for e in ranks if isinstance(e.get("wall_s"), (int, float))]
    if len(comm) == len(ranks) >= 2 and walls and statistics.median(walls) > 0:
        least = min(range(len(comm)), key=comm.__getitem__)
        return (_median_others(comm, least) - comm[least]) / statistics.median(walls)
    return None


def wait_even_from(last: Sequence[Mapping[str, Any]], gaps: Sequence[float]) -> Optional[str]:
    """``wait_even_text`` from the newest window and every window's ``wait_gap`` (None left out; or
    their ``Values``)."""
    unseen = next((UNSEEN[e["comm"]] for e in last if e.get("comm") in UNSEEN), None)
    if unseen:
        return (f"no rank's input stood out; a slow rank's compute cannot be named here: {unseen}, so waiting "
                "is not told apart from computing")
    if not gaps:
        return None
    return (f"ranks even: the rank that waited least in collectives waited {median_of(gaps):.0%} of a step "
            f"less than the others (median window){untimed_text(last)}")


def untimed_text(ranks: Sequence[Mapping[str, Any]]) -> str:
    """What to add where a rank ran collectives the hook could not time (``untimed_ops``), else ""."""
    counts = [float(e["untimed_ops"]) for e in ranks if isinstance(e.get("untimed_ops"), (int, float))]
    if not counts or max(counts) <= 0:
        return ""
    return (f"; up to {max(counts):g} collectives a step ran inside compiled code and are not timed: their time "
            "counts as compute")


def straggler_verdict(windows: Sequence[Sequence[Mapping[str, Any]]]) -> Optional[dict[str, Any]]:
    """The verdict over a run's windows, by the rule its timings call for."""
    return wait_verdict(windows) if timed_from_outside(windows) else compute_verdict(windows)


def ranks_even_text(windows: Sequence[Sequence[Mapping[str, Any]]]) -> Optional[str]:
    return wait_even_text(windows) if timed_from_outside(windows) else compute_even_text(windows)
