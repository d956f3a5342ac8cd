"""Benchmark plumbing: warm-up, interleaved repeats (A B A B ...), medians, ratios, JSON results.

Absolute times depend on the machine; only ratios against a baseline measured in the same run
are meant to be compared.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def time_command(argv: list[str], **kwargs) -> float:
    """Wall seconds of one run of ``argv`` (which must succeed)."""
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
    return time.perf_counter() - start


def interleaved(cases: dict[str, Callable[[], float]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run every case ``warmup`` times, then ``repeats`` rounds of A B C ... in turn."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            samples[name].append(fn())
    return samples


def summarize(samples: dict[str, list[float]], baseline: str) -> dict[str, dict[str, float]]:
    """Median, min and max per case, and the ratio of medians to the baseline's."""
    base = statistics.median(samples[baseline])
    return {name: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v),
                   "ratio_to_baseline": statistics.median(v) / base, "n": len(v)} for name, v in samples.items()}


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    import os

    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": str(os.cpu_count()), "system": platform.platform()}


def report(name: str, baseline: str, summary: dict[str, dict[str, float]], extra: dict | None = None) -> None:
    """Print a table and write ``bench/results/<name>.json``."""
    print(f"\n{name} (baseline: {baseline})")
    print(f"{'case':40s} {'median s':>10s} {'min s':>9s} {'ratio':>7s}")
    for case, row in summary.items():
        print(f"{case:40s} {row['median_s']:10.3f} {row['min_s']:9.3f} {row['ratio_to_baseline']:7.3f}")
    RESULTS.mkdir(exist_ok=True)
    data = {"benchmark": name, "baseline": baseline, "cases": summary, "machine": machine(), **(extra or {})}
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")


def fsdpctl_env(root: Path) -> dict[str, str]:
    """The environment a benchmark runs fsdpctl in: its own HOME and runs folder, this tree's code,
    no SSH agent (the testbed's key is named in the profile)."""
    import os

    env = {**os.environ, "HOME": str(root), "FSDPCTL_RUNS_DIR": str(root / "runs"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("SSH_AUTH_SOCK", None)
    return env


def start_lab(bench: str, names: tuple[str, ...] = ("n1", "n2"), own_shell_rc: bool = False):
    """The namespace testbed with sshd on every host, for a benchmark: (root folder, lab). Exits
    with the reason where it cannot be built (it needs root). ``own_shell_rc``: every host's sessions
    read an empty ~/.bashrc of their own. This machine's runs ``pyenv init``, whose rehash takes one
    lock in the home every fake host shares: past a few dozen hosts, sessions wait on each other for
    it (a real node's rc runs on its own)."""
    import sys
    import tempfile

    repo = Path(__file__).resolve().parents[1]
    if str(repo) not in sys.path:
        sys.path.insert(0, str(repo))
    from tests.testbed.lab import Lab, netns_available

    reason = netns_available()
    if reason:
        sys.exit(f"{bench}: the namespace testbed {reason}")
    root = Path(tempfile.mkdtemp(prefix=f"fsdpctl-bench-{bench}-"))
    lab = Lab(root, list(names)).up()
    rc = root / "node-bashrc"
    rc.write_text("")
    overlays = {str(Path.home() / ".bashrc"): rc} if own_shell_rc and (Path.home() / ".bashrc").is_file() else None
    try:
        for name in names:
            lab.start_sshd(name, overlays=overlays)
    except BaseException:
        lab.down()
        raise
    return root, lab
