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


def read_samples(texts: Iterable[str]) -> list[dict[str, Any]]:
    """Every sample in ``texts`` (JSON lines; a line cut short is skipped), oldest first."""
    samples = []
    for text in texts:
        for line in text.splitlines():
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            if isinstance(sample, dict) and isinstance(sample.get("gpus"), list):
                samples.append(sample)
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


def _series(samples: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """(host, GPU index) -> that GPU's entries, oldest first."""
    out: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for sample in samples:
        for gpu in sample.get("gpus") or []:
            out.setdefault((str(sample.get("host")), str(gpu.get("index"))), []).append(gpu)
    return out


def gpu_cause(samples: Sequence[Mapping[str, Any]], host: str, gpu_indexes: Sequence[int]) -> Optional[str]:
    """What the samples say slowed these GPUs of ``host`` (a straggler's), or None."""
    series = _series(samples)
    medians = {key: statistics.median(v) for key, entries in series.items()
               if (v := [float(e["sm_mhz"]) for e in entries if e.get("sm_mhz") is not None])}
    for index in gpu_indexes:
        entries = series.get((host, str(index)), [])
        if not entries:
            continue
        reasons = Counter(r for e in entries for r in e.get("reasons") or [])
        if reasons:
            reason, times = reasons.most_common(1)[0]
            if times >= REASON_SHARE * len(entries):
                during = [float(e["sm_mhz"]) for e in entries if reason in (e.get("reasons") or [])
                          and e.get("sm_mhz") is not None]
                top = next((e.get("sm_max_mhz") for e in entries if e.get("sm_max_mhz")), None)
                clock = f" at {_mhz(statistics.median(during))} MHz of {_mhz(top)}" if during else ""
                return f"GPU {index} on {host}{clock}: {reason} (in {times} of {len(entries)} samples)"
        mine = medians.get((host, str(index)))
        others = [m for key, m in medians.items() if key != (host, str(index))]
        if mine is not None and others and mine < CLOCK_RATIO * statistics.median(others):
            return (f"GPU {index} on {host} ran at {_mhz(mine)} MHz where the others ran at "
                    f"{_mhz(statistics.median(others))} (median SM clocks)")
    return None


def run_lines(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """Per node, its GPUs over the run: SM clock (median and lowest), hottest, median power and
    utilisation, and every slowdown reason seen with how often."""
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for sample in samples:
        by_host.setdefault(str(sample.get("host")), []).append(sample)
    lines = []
    for host, mine in sorted(by_host.items()):
        gpus = [g for s in mine for g in s.get("gpus") or []]
        clocks = [float(g["sm_mhz"]) for g in gpus if g.get("sm_mhz") is not None]
        temps = [float(g["temp_c"]) for g in gpus if g.get("temp_c") is not None]
        utils = [float(g["util_pct"]) for g in gpus if g.get("util_pct") is not None]
        reasons = Counter(f"GPU {g.get('index')} {r}" for g in gpus for r in g.get("reasons") or [])
        parts = [f"{len(mine)} samples"]
        if clocks:
            parts.append(f"SM median {_mhz(statistics.median(clocks))} MHz (lowest {_mhz(min(clocks))})")
        if temps:
            parts.append(f"hottest {max(temps):.0f} C")
        if utils:
            parts.append(f"util median {statistics.median(utils):.0f} %")
        seen = "; ".join(f"{what} in {n}" for what, n in reasons.most_common())
        lines.append(f"GPUs on {host}: {', '.join(parts)}" + (f"; {seen}" if seen else ""))
    return lines
