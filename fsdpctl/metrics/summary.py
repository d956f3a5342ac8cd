"""What ``fsdpctl report`` says about a run, and runs side by side: pure figures from the metrics."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .rows import Series
from .wait_rule import ranks_even_text, straggler_verdict


@dataclass
class RunSummary:
    """The figures of one run (None: not in its metrics)."""

    name: str
    steps: Optional[int] = None
    final_loss: Optional[float] = None
    best_loss: Optional[float] = None
    best_loss_step: Optional[int] = None
    final_val_loss: Optional[float] = None
    best_val_loss: Optional[float] = None
    tokens_per_s: Optional[float] = None
    """Median over the logged windows."""
    mfu: Optional[float] = None
    step_time_s: Optional[float] = None
    memory_mb_per_rank: list[float] = field(default_factory=list)
    world: int = 0
    straggler: Optional[dict[str, Any]] = None
    ranks_text: Optional[str] = None
    """What to say of the ranks when nobody stands out (None: no per-rank timings)."""
    attempts: int = 1
    state: Optional[str] = None
    skipped_lines: int = 0
    notes: list[str] = field(default_factory=list)
    """What could not be done (metrics not fetched again from nodes that are gone)."""
    gpus: list[str] = field(default_factory=list)
    """Each node's GPUs over the run, from its samples (clocks, heat, utilisation, slowdowns seen)."""
    timeline: list[str] = field(default_factory=list)
    """Where its launch's seconds went (``status --timings``), as text lines."""

    @property
    def restarts(self) -> int:
        """Attempts after the first (automatic restarts and resumes alike)."""
        return self.attempts - 1

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "restarts": self.restarts}


ONE_RANK_TEXT = "a single rank, with no other rank to compare its timings with"
"""What ``report`` says of the ranks of a one-rank run that has per-rank timings."""


def _median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(series: Series, *, attempts: int = 1, state: Optional[str] = None) -> RunSummary:
    """The summary of one run's series."""
    out = RunSummary(series.name, attempts=attempts, state=state, skipped_lines=series.skipped)
    steps, losses = series.column("loss")
    if losses:
        out.steps, out.final_loss = steps[-1], losses[-1]
        best = min(range(len(losses)), key=losses.__getitem__)
        out.best_loss, out.best_loss_step = losses[best], steps[best]
    _, val = series.column("val_loss", series.val or series.train)
    if val:
        out.final_val_loss, out.best_val_loss = val[-1], min(val)
    out.tokens_per_s = _median(series.column("tokens_per_s")[1])
    out.mfu = _median(series.column("mfu")[1])
    windows = series.windows()
    walls = [statistics.median(e["wall_s"] for e in w) for w in windows if all("wall_s" in e for e in w)]
    out.step_time_s = _median(series.column("step_time_s")[1]) or _median(walls)
    if out.step_time_s is None and series.summary:
        out.step_time_s = series.summary.get("median_step_time_s")
    if out.step_time_s is None and out.tokens_per_s and series.summary and series.summary.get("tokens_per_step"):
        out.step_time_s = series.summary["tokens_per_step"] / out.tokens_per_s
    out.world = series.world or int((series.summary or {}).get("world_size") or 0)
    if windows and all("mem_mb" in e for e in windows[-1]):
        out.memory_mb_per_rank = [float(e["mem_mb"]) for e in windows[-1]]
    elif series.summary and series.summary.get("peak_memory_mb_per_rank"):
        out.memory_mb_per_rank = [float(v) for v in series.summary["peak_memory_mb_per_rank"]]
    out.straggler = straggler_verdict(windows)
    out.ranks_text = None if out.straggler else ranks_even_text(windows)
    if out.ranks_text is None and windows and series.world == 1:
        out.ranks_text = ONE_RANK_TEXT  # timed, but a straggler is only slower than other ranks
    return out


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


ROWS = (("steps", "steps", ""), ("final loss", "final_loss", ".4f"), ("best loss", "best_loss", ".4f"),
        ("final val loss", "final_val_loss", ".4f"), ("best val loss", "best_val_loss", ".4f"),
        ("tokens/s (median)", "tokens_per_s", ",.0f"), ("MFU (median)", "mfu", ".1%"),
        ("time per step", "step_time_s", ".3f"), ("ranks", "world", ""), ("attempts", "attempts", ""),
        ("restarts", "restarts", ""))


def render(summaries: list[RunSummary]) -> str:
    """The terminal text: one run as a list, several side by side, then each straggler verdict."""
    lines: list[str] = []
    names = [s.name for s in summaries]
    width = max(len(label) for label, _, _ in ROWS) + 2
    cols = [max(len(n), 12) for n in names]
    lines.append(" " * width + "  ".join(n.rjust(c) for n, c in zip(names, cols, strict=True)))
    for label, attr, spec in ROWS:
        values = [_fmt(getattr(s, attr), spec) for s in summaries]
        if attr == "step_time_s":
            values = [v if v == "-" else f"{v} s" for v in values]
        if attr == "mfu" and all(v == "-" for v in values):
            values = ["n/a (CPU)" if s.world else "-" for s in summaries]
        lines.append(label.ljust(width) + "  ".join(v.rjust(c) for v, c in zip(values, cols, strict=True)))
    mems = [s.memory_mb_per_rank for s in summaries]
    if any(mems):
        values = [f"{min(m):,.0f}-{max(m):,.0f} MB" if m else "-" for m in mems]
        lines.append("memory per rank".ljust(width) + "  ".join(v.rjust(c) for v, c in zip(values, cols, strict=True)))
    for s in summaries:
        prefix = f"{s.name}: " if len(summaries) > 1 else ""
        if s.straggler:
            lines.append(f"{prefix}{s.straggler['text']}")
            if s.straggler.get("cause"):
                lines.append(f"{prefix}  cause, from its GPU's samples: {s.straggler['cause']}")
        elif s.ranks_text:
            lines.append(f"{prefix}no straggler: {s.ranks_text}")
        else:
            lines.append(f"{prefix}no per-rank timings in its metrics: no straggler verdict")
        lines += [f"{prefix}{line}" for line in s.gpus]
        for note in s.notes:
            lines.append(f"{prefix}{note}")
        if s.timeline:
            lines.append(f"{prefix}where the launch's seconds went (seconds after it began):")
            lines += [f"{prefix}  {line}" for line in s.timeline]
        if s.skipped_lines:
            lines.append(f"{prefix}{s.skipped_lines} line(s) of metrics.jsonl were not JSON rows with a step: skipped")
    return "\n".join(lines)


@dataclass
class Report:
    """``summaries`` (one per run, in the order given), ``text`` (what the command prints) and the
    figures written (``plots``; empty without ``plot``)."""

    summaries: list[RunSummary]
    series: list[Series] = field(repr=False)
    plots: list[Path] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The report as ``fsdpctl report`` prints it."""
        return render(self.summaries)

    def to_json(self) -> dict[str, Any]:
        """The report as ``report --json`` prints it."""
        return {"runs": [s.to_json() for s in self.summaries], "plots": [str(p) for p in self.plots]}
