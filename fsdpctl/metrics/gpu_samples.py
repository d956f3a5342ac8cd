"""The GPU samples a run's nodes took (``gpu/node<R>.jsonl``, written by ``fsdpctl.node.gpu_watch``)
read back: each node's GPUs as they stand (``status``), over the run (``report``), and what they say of
a straggler's cause.

A cause is named only from what a GPU itself reported: a clock reason that slows it (HW slowdown,
HW thermal slowdown, HW power brake, SW thermal slowdown, SW power cap) in at least a fifth of its
samples, else an SM clock whose median is below 0.9x the median of the other GPUs' medians. A
straggler whose GPUs show neither gets no cause from here (the workload's own text lists the
usual ones).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

REASON_SHARE = 0.2
CLOCK_RATIO = 0.9
GPU_SAMPLES_SHOWN = 24
"""The newest samples per node ``status`` reads (two minutes at the default 5 s)."""


def sample_of(line: str) -> Optional[dict[str, Any]]:
    """A line of a samples file as a sample (a JSON object with a list of ``gpus``); None for a line
    cut short, or anything else."""
    try:
        sample = json.loads(line)
    except ValueError:
        return None
    return sample if isinstance(sample, dict) and isinstance(sample.get("gpus"), list) else None


def read_samples(texts: Iterable[str]) -> list[dict[str, Any]]:
    """Every sample in ``texts`` (JSON lines; a line cut short is skipped), oldest first."""
    samples = [sample for text in texts for line in text.splitlines() if (sample := sample_of(line)) is not None]
    return sorted(samples, key=lambda s: s.get("t") or 0)


def newest_text(path: Path, limit: int = 256 << 10) -> str:
    """The end of a node's samples file (``status`` needs its newest lines; a day's file is tens of
    MB); "" when there is none. The first line, likely cut, is skipped by ``read_samples``."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def newest_samples(texts: Sequence[str]) -> tuple[dict[str, Any], ...]:
    """The last ``GPU_SAMPLES_SHOWN`` samples of each node in ``texts``, oldest first."""
    by_node: dict[Any, list[dict[str, Any]]] = {}
    for sample in read_samples(texts):
        by_node.setdefault(sample.get("node"), []).append(sample)
    return tuple(s for mine in by_node.values() for s in mine[-GPU_SAMPLES_SHOWN:])


def read_files(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The samples of these files (each node's file once, by name: a shared run directory brings
    every node's file from every node)."""
    by_name: dict[str, Path] = {}
    for path in paths:
        by_name.setdefault(path.name, path)
    texts = []
    for path in by_name.values():
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return read_samples(texts)


def _span(values: Sequence[Optional[float]], unit: str) -> Optional[str]:
    found = [v for v in values if v is not None]
    if not found:
        return None
    low, high = min(found), max(found)
    return f"{low:.0f}{unit}" if round(low) == round(high) else f"{low:.0f}-{high:.0f}{unit}"


def now_text(sample: Mapping[str, Any]) -> str:
    """One node's GPUs in its newest sample: ``4 GPU(s): SM 1980 MHz, 61-66 C, 690-700 W, util 98-100 %;
    GPU 3 (00000000:3B:00.0) HW slowdown at 1095 MHz of 1980``."""
    gpus = sample.get("gpus") or []
    figures = (("SM ", "sm_mhz", " MHz"), ("", "temp_c", " C"), ("", "power_w", " W"), ("util ", "util_pct", " %"))
    parts = [label + span for label, key, unit in figures if (span := _span([g.get(key) for g in gpus], unit))]
    text = f"{len(gpus)} GPU(s): {', '.join(parts)}" if parts else f"{len(gpus)} GPU(s)"
    slowed = [f"GPU {g.get('index')} ({g.get('bus_id')}) {', '.join(g['reasons'])} at {_mhz(g.get('sm_mhz'))} MHz "
              f"of {_mhz(g.get('sm_max_mhz'))}" for g in gpus if g.get("reasons")]
    return text + ("; " + "; ".join(slowed) if slowed else "")


def _mhz(value: Any) -> str:
    return "?" if value is None else f"{float(value):,.0f}"


def latest_by_node(samples: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Each node's newest sample."""
    latest: dict[int, Mapping[str, Any]] = {}
    for sample in samples:
        node = sample.get("node")
        if isinstance(node, int):
            latest[node] = sample
    return latest


def counted_median(counts: Mapping[float, int]) -> Optional[float]:
    """The median of values given as value -> how many times (``statistics.median`` of them all)."""
    total = sum(counts.values())
    if not total:
        return None
    wanted = [(total - 1) // 2, total // 2]
    found: list[float] = []
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        while len(found) < 2 and wanted[len(found)] < seen:
            found.append(float(value))
    return found[0] if total % 2 else (found[0] + found[1]) / 2


class GpuFold:
    """A run's GPU samples summed up as they come, in bounded memory (values counted, clocks and
    utilisation being whole numbers): each node's GPUs over the run (``lines``) and what slowed a
    straggler's GPUs (``cause``). Plain data in ``state``; ``restore`` takes it back."""

    def __init__(self) -> None:
        self.hosts: dict[str, dict[str, Any]] = {}
        self.gpus: dict[tuple[str, str], dict[str, Any]] = {}

    @classmethod
    def of(cls, samples: Iterable[Mapping[str, Any]]) -> GpuFold:
        fold = cls()
        for sample in samples:
            fold.add(sample)
        return fold

    def add(self, sample: Mapping[str, Any]) -> None:
        host = str(sample.get("host"))
        mine = self.hosts.setdefault(host, {"samples": 0, "clocks": Counter(), "hottest": None, "utils": Counter(),
                                            "reasons": Counter()})
        mine["samples"] += 1
        for gpu in sample.get("gpus") or []:
            index = str(gpu.get("index"))
            each = self.gpus.setdefault((host, index), {"entries": 0, "clocks": Counter(), "reasons": Counter(),
                                                        "during": {}, "top": None})
            each["entries"] += 1
            reasons = gpu.get("reasons") or []
            if gpu.get("sm_mhz") is not None:
                clock = float(gpu["sm_mhz"])
                mine["clocks"][clock] += 1
                each["clocks"][clock] += 1
                for reason in reasons:
                    each["during"].setdefault(reason, Counter())[clock] += 1
            if gpu.get("temp_c") is not None:
                temp = float(gpu["temp_c"])
                mine["hottest"] = temp if mine["hottest"] is None else max(mine["hottest"], temp)
            if gpu.get("util_pct") is not None:
                mine["utils"][float(gpu["util_pct"])] += 1
            for reason in reasons:
                mine["reasons"][f"GPU {gpu.get('index')} {reason}"] += 1
                each["reasons"][reason] += 1
            if each["top"] is None and gpu.get("sm_max_mhz"):
                each["top"] = gpu["sm_max_mhz"]

    def lines(self) -> list[str]:
        """Per node, its GPUs over the run: SM clock (median and lowest), hottest, median power and
        utilisation, and every slowdown reason seen with how often."""
        lines = []
        for host, mine in sorted(self.hosts.items()):
            parts = [f"{mine['samples']} samples"]
            if mine["clocks"]:
                median, lowest = counted_median(mine["clocks"]), min(mine["clocks"])
                parts.append(f"SM median {_mhz(median)} MHz (lowest {_mhz(lowest)})")
            if mine["hottest"] is not None:
                parts.append(f"hottest {mine['hottest']:.0f} C")
            if mine["utils"]:
                parts.append(f"util median {counted_median(mine['utils']):.0f} %")
            seen = "; ".join(f"{what} in {n}" for what, n in mine["reasons"].most_common())
            lines.append(f"GPUs on {host}: {', '.join(parts)}" + (f"; {seen}" if seen else ""))
        return lines

    def cause(self, host: str, gpu_indexes: Sequence[int]) -> Optional[str]:
        """What the samples say slowed these GPUs of ``host`` (a straggler's), or None."""
        medians = {key: counted_median(each["clocks"]) for key, each in self.gpus.items() if each["clocks"]}
        for index in gpu_indexes:
            each = self.gpus.get((host, str(index)))
            if not each or not each["entries"]:
                continue
            if each["reasons"]:
                reason, times = each["reasons"].most_common(1)[0]
                if times >= REASON_SHARE * each["entries"]:
                    during = each["during"].get(reason)
                    clock = f" at {_mhz(counted_median(during))} MHz of {_mhz(each['top'])}" if during else ""
                    return f"GPU {index} on {host}{clock}: {reason} (in {times} of {each['entries']} samples)"
            mine = medians.get((host, str(index)))
            others = [m for key, m in medians.items() if key != (host, str(index))]
            if mine is not None and others and mine < CLOCK_RATIO * statistics.median(others):
                return (f"GPU {index} on {host} ran at {_mhz(mine)} MHz where the others ran at "
                        f"{_mhz(statistics.median(others))} (median SM clocks)")
        return None

    def state(self) -> dict[str, Any]:
        def pairs(counts: Counter) -> list[list[Any]]:
            return [[k, v] for k, v in counts.items()]

        return {"hosts": [[host, {**mine, "clocks": pairs(mine["clocks"]), "utils": pairs(mine["utils"]),
                                  "reasons": pairs(mine["reasons"])}] for host, mine in self.hosts.items()],
                "gpus": [[host, index, {**each, "clocks": pairs(each["clocks"]), "reasons": pairs(each["reasons"]),
                                        "during": [[r, pairs(c)] for r, c in each["during"].items()]}]
                         for (host, index), each in self.gpus.items()]}

    def restore(self, state: Mapping[str, Any]) -> None:
        def counter(pairs: list[list[Any]], number: bool = True) -> Counter:
            return Counter({(float(k) if number else str(k)): int(v) for k, v in pairs})

        self.hosts = {str(host): {"samples": int(mine["samples"]), "hottest": mine["hottest"],
                                  "clocks": counter(mine["clocks"]), "utils": counter(mine["utils"]),
                                  "reasons": counter(mine["reasons"], number=False)} for host, mine in state["hosts"]}
        self.gpus = {(str(host), str(index)): {"entries": int(each["entries"]), "top": each["top"],
                                               "clocks": counter(each["clocks"]),
                                               "reasons": counter(each["reasons"], number=False),
                                               "during": {str(r): counter(c) for r, c in each["during"]}}
                     for host, index, each in state["gpus"]}


def gpu_cause(samples: Sequence[Mapping[str, Any]], host: str, gpu_indexes: Sequence[int]) -> Optional[str]:
    """What the samples say slowed these GPUs of ``host`` (a straggler's), or None."""
    return GpuFold.of(samples).cause(host, gpu_indexes)


def run_lines(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per node, its GPUs over the run (``GpuFold.lines``)."""
    return GpuFold.of(samples).lines()
