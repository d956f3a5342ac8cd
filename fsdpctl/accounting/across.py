"""Many runs' goodput at once (``report --goodput``): the GPU-hours a team held over a period or on a
profile, where they went, and the runs that lost the most, each with its largest loss named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .account import CATEGORIES, Account, combine
from .render import bar, duration

WORST = 5
"""Runs named in the worst list."""


@dataclass
class RunAccount:
    run_id: str
    profile: str
    created_at: Optional[str]
    account: Account

    @property
    def lost_gpu_s(self) -> float:
        """GPU-seconds held outside productive steps."""
        return self.account.held_gpu_s - self.account.gpu_s["productive"]

    def largest_loss(self) -> tuple[str, float]:
        """The category (not productive) with the most GPU-seconds, and its share of the run's."""
        rest = {k: v for k, v in self.account.gpu_s.items() if k != "productive"}
        name = max(rest, key=rest.__getitem__)
        return name, rest[name] / self.account.held_gpu_s if self.account.held_gpu_s > 0 else 0.0


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def lines(runs: list[RunAccount], heading: str, skipped: list[str]) -> list[str]:
    """The text: totals, a bar and a table by category in GPU-hours, then the worst runs."""
    if not runs:
        return [f"goodput of no run {heading}" + (f" ({len(skipped)} without an account)" if skipped else "")]
    total = combine([r.account for r in runs])
    held = total.held_gpu_s
    out = [f"goodput of {len(runs)} run(s) {heading}: {held / 3600:,.3f} GPU-h held over "
           f"{duration(total.wall_s)} of runs; ETTR {_pct(total.ettr)}, strict {_pct(total.goodput)}"]
    if total.queued_s:
        out.append(f"  (and {duration(total.queued_s)} in a scheduler's queue, not held)")
    out.append(f"  {bar(total)}")
    width = max(len(v) for v in CATEGORIES.values())
    out.append(f"  {'category'.ljust(width)}  {'GPU-h':>10}  {'share':>6}")
    for name, label in CATEGORIES.items():
        gpu = total.gpu_s[name]
        if gpu > 0:
            out.append(f"  {label.ljust(width)}  {gpu / 3600:>10.3f}  {_pct(gpu / held if held > 0 else None):>6}")
    worst = sorted(runs, key=lambda r: r.lost_gpu_s, reverse=True)[:WORST]
    out.append(f"  the runs that lost the most GPU-hours outside productive steps (of {len(runs)}):")
    for run in worst:
        name, share = run.largest_loss()
        out.append(f"    {run.run_id} ({run.profile}): {run.lost_gpu_s / 3600:,.3f} of "
                   f"{run.account.held_gpu_s / 3600:,.3f} GPU-h lost, ETTR {_pct(run.account.ettr)}; largest: "
                   f"{CATEGORIES[name]} ({_pct(share)})")
    if skipped:
        out.append(f"  {len(skipped)} run(s) without an account (no timeline): {', '.join(skipped[:5])}"
                   + (" ..." if len(skipped) > 5 else ""))
    return out


def to_json(runs: list[RunAccount], heading: str, skipped: list[str]) -> dict[str, Any]:
    total = combine([r.account for r in runs]) if runs else None
    return {"heading": heading, "total": total.to_json() if total else None, "skipped": skipped,
            "runs": [{"run_id": r.run_id, "profile": r.profile, "created_at": r.created_at,
                      "lost_gpu_hours": round(r.lost_gpu_s / 3600, 6), "largest_loss": r.largest_loss()[0],
                      **r.account.to_json()} for r in runs]}
