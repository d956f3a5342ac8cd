"""A goodput account as text: one line (``status``, ``top``), and a section of a report (a bar of the
categories, then a table of seconds, shares and GPU-hours)."""

from __future__ import annotations

from .account import CATEGORIES, IN_STEPS, Account

BAR_WIDTH = 60
_MARKS = {"productive": "#", "data_wait": "d", "collective_wait": "c", "warmup": "w", "startup": "s",
          "checkpoint_load": "l", "checkpoint_save": "k", "between_steps": "e", "redone": "R", "hang": "H",
          "stood_still": "x", "shutdown": "z", "release": "r", "idle": "i", "unattributed": "?"}


def _share(value: float, total: float) -> str:
    return f"{100 * value / total:.1f}%" if total > 0 else "-"


def duration(seconds: float) -> str:
    """``42.0 s``, ``12.5 min``, ``3.20 h``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def _lost(account: Account) -> tuple[str, float]:
    """The largest category of time outside productive steps, and its seconds."""
    rest = {k: v for k, v in account.seconds.items() if k != "productive"}
    name = max(rest, key=rest.__getitem__)
    return name, rest[name]


def one_line(account: Account) -> str:
    """``goodput: ETTR 91.2%, strict 84.0% of 1.20 h; most lost to start-up (4.1%)``."""
    ettr, strict = account.ettr, account.goodput
    if ettr is None or strict is None:
        return "goodput: no time held yet"
    name, seconds = _lost(account)
    lost = f"; most lost to {CATEGORIES[name]} ({_share(seconds, account.wall_s)})" if seconds > 0 else ""
    return f"goodput: ETTR {100 * ettr:.1f}%, strict {100 * strict:.1f}% of {duration(account.wall_s)}{lost}"


def bar(account: Account, width: int = BAR_WIDTH) -> str:
    """The categories' shares of wall time as one bar of marks (largest remainders rounding)."""
    total = account.wall_s
    if total <= 0:
        return ""
    exact = {k: width * v / total for k, v in account.seconds.items() if v > 0}
    cells = {k: int(v) for k, v in exact.items()}
    for name in sorted(exact, key=lambda k: exact[k] - cells[k], reverse=True)[:width - sum(cells.values())]:
        cells[name] += 1
    return "[" + "".join(_MARKS[k] * cells.get(k, 0) for k in CATEGORIES) + "]"


def section(account: Account) -> list[str]:
    """The report's goodput section."""
    lines = [one_line(account)]
    if account.wall_s <= 0:
        return lines
    held = account.held_gpu_s / 3600
    lines.append(f"  held {duration(account.wall_s)} x devices = {held:,.3f} GPU-h (ranks stand for GPUs on a CPU)"
                 f"{f', after {duration(account.queued_s)} in the queue' if account.queued_s else ''}; "
                 f"{account.attempts} attempt(s)")
    lines.append(f"  {bar(account)}")
    width = max(len(v) for v in CATEGORIES.values())
    lines.append(f"  {'':2}{'category'.ljust(width)}  {'seconds':>10}  {'share':>6}  {'GPU-h':>9}")
    for name, what in CATEGORIES.items():
        seconds, gpu = account.seconds[name], account.gpu_s[name]
        if seconds <= 0 and gpu <= 0:
            continue
        lines.append(f"  {_MARKS[name]} {what.ljust(width)}  {seconds:>10.1f}  {_share(seconds, account.wall_s):>6}"
                     f"  {gpu / 3600:>9.4f}")
    in_steps = sum(account.seconds[c] for c in IN_STEPS)
    lines.append(f"  ETTR: time in steps that survived / wall = {in_steps:.1f} / {account.wall_s:.1f} s; strict "
                 f"goodput: productive / wall")
    if account.steps_redone:
        lines.append(f"  {account.steps_redone} step(s) done again, booked on the attempt that was thrown away")
    if account.straggler_s > 0.05 * max(account.seconds["collective_wait"], 1e-9) and account.straggler_s >= 0.1:
        lines.append(f"  what-if: the other ranks waited {account.straggler_s:.1f} s for the slowest rank's compute "
                     f"(inside collective wait)")
    if account.async_save_s or account.async_wait_s or account.async_written_s:
        lines.append(f"  async saves: {account.async_save_s:.1f} s in their calls and {account.async_wait_s:.1f} s "
                     f"waiting on them (both in checkpoint save); {account.async_written_s:.1f} s written behind "
                     "the steps (not counted)")
    if account.eval_s:
        lines.append(f"  of the time between steps, evaluation: {account.eval_s:.1f} s")
    return lines
