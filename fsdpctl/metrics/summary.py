"""What ``fsdpctl report`` says about a run, and runs side by side: pure figures from the metrics."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .fold import Fold
from .rank_table import NOT_KEPT_NOTE, table_lines
from .rows import Series


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
    ranks: list[dict[str, Any]] = field(default_factory=list)
    """Every rank of the windows judged, in rank order: ``rank``, ``node``, ``host``, ``local_rank``;
    ``compute_s``, ``comm_s`` (collective wait) and ``data_s`` in seconds per step, and
    ``untimed_ops`` (collectives a step not timed: inside compiled code), each a step-weighted mean over
    the windows (None: not measured); ``mem_mb``, its peak; ``straggler``, whether the verdict names it."""
    unseen_text: Optional[str] = None
    """Ranks whose steps the start-up hook could not see, and why (None: none)."""
    attempts: int = 1
    state: Optional[str] = None
    skipped_lines: int = 0
    notes: list[str] = field(default_factory=list)
    """What could not be done (metrics not fetched again from nodes that are gone)."""
    gpus: list[str] = field(default_factory=list)
    """Each node's GPUs over the run, from its samples (clocks, heat, utilisation, slowdowns seen)."""
    timeline: list[str] = field(default_factory=list)
    """Where its launch's seconds went (``status --timings``), as text lines."""
    goodput: Optional[dict[str, Any]] = None
    """Where all its time went (``fsdpctl.accounting``): the account as JSON."""
    goodput_lines: list[str] = field(default_factory=list)
    """The same as the report's text section."""
    profiles: list[dict[str, Any]] = field(default_factory=list)
    """Its profiles (``fsdpctl profile``, ``--profile-steps``): each one's summary and merged trace."""

    @property
    def restarts(self) -> int:
        """Attempts after the first (automatic restarts and resumes alike)."""
        return self.attempts - 1

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "restarts": self.restarts}


"""What ``report`` says of the ranks of a one-rank run that has per-rank timings."""


def _median(values: list[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def summarize(series: Series, *, attempts: int = 1, state: Optional[str] = None) -> RunSummary:
    """The summary of one run's series (by the same fold the run's chart index keeps)."""
    return summary_of(Fold.of_rows(series.train, series.val, series.events), series.name, attempts=attempts,
                      state=state, skipped=series.skipped, workload_summary=series.summary)


def summary_of(fold: Fold, name: str, *, attempts: int = 1, state: Optional[str] = None, skipped: int = 0,
               workload_summary: Optional[dict[str, Any]] = None) -> RunSummary:
    """The summary of a run's rows folded (``fsdpctl.metrics.fold``): from its chart index, or read."""
    return RunSummary(name, attempts=attempts, state=state, skipped_lines=skipped,
                      **fold.figures(workload_summary))


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    return format(value, spec) if spec else str(value)


ROWS = (("steps", "steps", ""), ("final loss", "final_loss", ".4f"), ("best loss", "best_loss", ".4f"),
        ("final val loss", "final_val_loss", ".4f"), ("best val loss", "best_val_loss", ".4f"),
        ("tokens/s (median)", "tokens_per_s", ",.0f"), ("MFU (median)", "mfu", ".1%"),
        ("time per step", "step_time_s", ".3f"), ("ranks", "world", ""), ("attempts", "attempts", ""),
        ("restarts", "restarts", ""))


def render(summaries: list[RunSummary], every_rank: bool = False) -> str:
    """The terminal text: one run as a list, several side by side, then each straggler verdict and
    table of ranks (above ``rank_table.FOLD_ABOVE`` ranks a few of them, unless ``every_rank``)."""
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
        elif not s.unseen_text:
            lines.append(f"{prefix}no per-rank timings in its metrics: no straggler verdict")
        if s.unseen_text:
            lines.append(f"{prefix}{s.unseen_text}")
        if s.ranks:
            lines += [f"{prefix}{line}" for line in table_lines(s.ranks, every_rank)]
        elif s.straggler or s.ranks_text:
            lines.append(f"{prefix}{NOT_KEPT_NOTE}")
        lines += [f"{prefix}{line}" for line in s.gpus]
        for note in s.notes:
            lines.append(f"{prefix}{note}")
        if s.timeline:
            lines.append(f"{prefix}where the launch's seconds went (seconds after it began):")
            lines += [f"{prefix}  {line}" for line in s.timeline]
        lines += [f"{prefix}{line}" for line in s.goodput_lines]
        for traced in s.profiles:
            steps = traced.get("steps") or []
            span = f"steps {steps[0]}-{steps[-1]}" if steps else "no step"
            lines.append(f"{prefix}profile {traced.get('profile_id')} ({span}, ranks "
                         f"{', '.join(map(str, traced.get('ranks_profiled') or []))}): {traced.get('verdict')}")
            lines.append(f"{prefix}  trace: {traced.get('trace')}")
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

    def as_text(self, every_rank: bool = False) -> str:
        """``text``, with ``every_rank`` every rank's line in its table of ranks (``report --ranks``)."""
        return render(self.summaries, every_rank)

    def to_json(self) -> dict[str, Any]:
        """The report as ``report --json`` prints it."""
        return {"runs": [s.to_json() for s in self.summaries], "plots": [str(p) for p in self.plots]}
