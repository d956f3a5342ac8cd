"""``fsdpctl top``'s screen: one snapshot drawn into a given width and height (80x24 at the least),
as lines of rich Text. Pure: the same snapshot and size draw the same screen, so it is tested as text.

From the top: the run, its progress bar and ETA, loss and tokens/s with their sparklines; the nodes
(host, ranks, state, step, their GPUs summed up, a slowed or faulty GPU named in colour); each rank's
compute time in the newest windows as a heat row (ranks folded by node when they do not fit), the
straggler and its cause; attempts, replacements, spares and excluded hosts; the newest log lines
(of one rank or node when filtered); the keys. What does not fit is folded, never wrapped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any, Optional

from rich.text import Text

from ..live.snapshot import GpuNow, NodeNow, RankNow, Snapshot
from .status import duration_text

SPARKS = "▁▂▃▄▅▆▇█"
HEAT = "▁▂▃▄▅▆▇█"
HEAT_COLOURS = ("green", "green", "green", "yellow", "yellow", "red", "red", "bold red")
HEAT_TOP = 1.5
"""A window's compute at this many times the window's median (or more) is the hottest block."""
STATE_COLOURS = {"running": "green", "succeeded": "green", "failed": "red", "lost": "red", "stopped": "yellow",
                 "interrupted": "yellow", "pending": "cyan", "submitted": "cyan", "starting": "cyan",
                 "unreachable": "red", "gone": "red", "timeout": "red", "cancelled": "yellow"}
KEYS = "q quit · r rank · n node · a all"


def duration(seconds: Optional[float]) -> str:
    """``45s``, ``12m03s``, ``3h04m``, ``2d03h``; ``-`` when unknown."""
    return "-" if seconds is None else duration_text(max(0.0, seconds))


def sparkline(values: Sequence[float], width: int) -> str:
    """The newest ``width`` values as blocks scaled from their lowest to their highest."""
    values = list(values)[-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    if high <= low:
        return SPARKS[3] * len(values)
    return "".join(SPARKS[min(7, int((v - low) / (high - low) * 7.999))] for v in values)


def _span(values: Sequence[Optional[float]], spec: str = ".0f") -> Optional[str]:
    found = [v for v in values if v is not None]
    if not found:
        return None
    low, high = min(found), max(found)
    return format(low, spec) if format(low, spec) == format(high, spec) else f"{low:{spec}}-{high:{spec}}"


def gpus_text(gpus: Sequence[GpuNow]) -> str:
    """A node's GPUs in one cell: ``8x 97-99% 1980/1980MHz 66C 5.5kW 61/80G``."""
    if not gpus:
        return "no GPU samples"
    parts = [f"{len(gpus)}x"]
    if (util := _span([g.util_pct for g in gpus])) is not None:
        parts.append(f"{util}%")
    clock = _span([g.sm_mhz for g in gpus])
    top = max((g.sm_max_mhz for g in gpus if g.sm_max_mhz), default=None)
    if clock is not None:
        parts.append(f"{clock}/{top:.0f}MHz" if top else f"{clock}MHz")
    hottest = max((g.temp_c for g in gpus if g.temp_c is not None), default=None)
    if hottest is not None:
        parts.append(f"{hottest:.0f}C")
    power = [g.power_w for g in gpus if g.power_w is not None]
    if power:
        total = sum(power)
        parts.append(f"{total / 1000:.1f}kW" if total >= 1000 else f"{total:.0f}W")
    used = [g.mem_mib for g in gpus if g.mem_mib is not None]
    if used:
        whole = [g.mem_total_mib for g in gpus if g.mem_total_mib]
        most = max(used) / 1024
        parts.append(f"{most:.0f}/{max(whole) / 1024:.0f}G" if whole else f"{most:.0f}G")
    return " ".join(parts)


def gpu_trouble(node: NodeNow) -> list[str]:
    """What is wrong with a node's GPUs now, one item per GPU: a slowdown with its clock, a fault."""
    out = []
    for gpu in node.gpus:
        said = [*gpu.reasons, *gpu.faults]
        if said:
            clock = f" {gpu.sm_mhz:,.0f}/{gpu.sm_max_mhz:,.0f} MHz" if gpu.sm_mhz and gpu.sm_max_mhz else ""
            out.append(f"GPU {gpu.index} ({gpu.bus_id}) {', '.join(said)}{clock}")
    return out + [f"fault: {fault}" for fault in node.faults[-2:]]


def _line(width: int) -> Text:
    return Text(no_wrap=True, overflow="ellipsis", end="")


def _crop(text: Text, width: int) -> Text:
    if text.cell_len > width:
        text.truncate(width, overflow="ellipsis")
    return text


def heat_cells(ranks: Sequence[RankNow]) -> dict[int, list[Optional[float]]]:
    """Per rank, each newest window's compute as a multiple of that window's median over the ranks."""
    width = max((len(r.recent_compute_s) for r in ranks), default=0)
    medians = []
    for i in range(width):
        column = [r.recent_compute_s[i] for r in ranks if i < len(r.recent_compute_s)
                  and r.recent_compute_s[i] is not None]
        medians.append(statistics.median(column) if column else None)
    out = {}
    for r in ranks:
        cells = []
        for i, value in enumerate(r.recent_compute_s):
            median = medians[i] if i < len(medians) else None
            cells.append(value / median if value is not None and median else None)
        out[r.rank] = cells
    return out


def _heat(cells: Sequence[Optional[float]], count: int) -> Text:
    text = Text(end="")
    for ratio in list(cells)[-count:]:
        if ratio is None:
            text.append(" ")
            continue
        level = max(0, min(7, int((ratio - 1.0) / (HEAT_TOP - 1.0) * 7.999))) if ratio > 1.0 else 0
        text.append(HEAT[level], style=HEAT_COLOURS[level])
    return text


class Screen:
    """Lines for one screen, and how many are left."""

    def __init__(self, width: int, height: int):
        self.width, self.height, self.lines = width, height, []

    @property
    def left(self) -> int:
        return self.height - len(self.lines)

    def add(self, *parts: Any) -> None:
        if self.left <= 0:
            return
        text = _line(self.width)
        for part in parts:
            if isinstance(part, Text):
                text.append_text(part)
            elif isinstance(part, tuple):
                text.append(*part)
            else:
                text.append(str(part))
        self.lines.append(_crop(text, self.width))


def render(snap: Snapshot, width: int = 80, height: int = 24, *, rank: Optional[int] = None,
           node: Optional[int] = None, prompt: Optional[str] = None, keys: bool = True) -> Text:
    """The screen for ``snap`` (``rank`` / ``node``: the log lines of that one only; ``prompt``: what
    is being typed at the bottom)."""
    width, height = max(40, width), max(12, height)
    screen = Screen(width, height - (1 if keys else 0))
    run = snap.run
    colour = STATE_COLOURS.get(run.state, "white")
    live = Text(" live", style="green") if run.live else Text("" if snap.over else " NOT LIVE", style="bold red")
    screen.add((f"{run.run_id}", "bold"), "  ", (run.state, colour), f"  attempt {run.attempt}",
               f"  {duration(run.elapsed_s)}", f"  {run.backend}", live)
    _progress(screen, snap)
    _figures(screen, snap)
    if run.note:
        screen.add((run.note, "red"))
    if run.first_failure and snap.over:
        screen.add(("first failure: " + run.first_failure, "red"))
    logs_room = 4 if snap.logs else 0
    tail = 2 + (1 if snap.attempts or snap.replacements or snap.hosts.spares or snap.hosts.excluded else 0) \
        + (1 if snap.goodput else 0)
    _nodes(screen, snap.nodes, screen.left - logs_room - tail - _heat_height(snap, width))
    _ranks(screen, snap, screen.left - logs_room - tail)
    _straggler(screen, snap)
    _attempts(screen, snap)
    if snap.goodput:
        screen.add((snap.goodput, "cyan"))
    _logs(screen, snap, rank, node)
    out = Text("\n").join(screen.lines + [Text("")] * max(0, screen.left))
    if keys:
        bottom = Text(prompt if prompt is not None else f" {KEYS}", style="reverse" if prompt is not None else "dim",
                      no_wrap=True, end="")
        out.append("\n")
        out.append_text(_crop(bottom, width))
    return out


def _progress(screen: Screen, snap: Snapshot) -> None:
    run = snap.run
    if run.step is None:
        screen.add(("no step yet" if run.metrics or not snap.over else "no metrics from this program", "dim"))
        return
    if run.total_steps:
        done = min(1.0, run.step / run.total_steps)
        bar = max(10, screen.width - 48)
        filled = int(done * bar)
        screen.add(f"step {run.step:,}/{run.total_steps:,} ", ("█" * filled, "green"), ("░" * (bar - filled), "dim"),
                   f" {done:4.0%}", f"  ETA {duration(run.eta_s)}" if run.eta_s is not None else "")
    else:
        screen.add(f"step {run.step:,}")


def _figures(screen: Screen, snap: Snapshot) -> None:
    run = snap.run
    if run.loss is None and run.tokens_per_s is None:
        return
    spark = max(6, (screen.width - 60) // 2)
    parts: list[Any] = []
    if run.loss is not None:
        parts += [f"loss {run.loss:.4f} ", (sparkline([v for _, v in run.loss_history], spark), "cyan")]
    if run.val_loss is not None:
        parts.append(f"  val {run.val_loss:.4f}")
    if run.tokens_per_s is not None:
        parts += [f"  tok/s {run.tokens_per_s:,.0f} ", (sparkline([v for _, v in run.tokens_history], spark), "cyan")]
    if run.mfu is not None:
        parts.append(f"  MFU {run.mfu:.1%}")
    screen.add(*parts)


def _node_order(nodes: Sequence[NodeNow]) -> list[NodeNow]:
    """Nodes in trouble first (failed, lost, a slowed or faulty GPU), then by node rank."""
    def trouble(n: NodeNow) -> int:
        return 0 if n.state in ("failed", "lost", "unreachable", "gone") else 1 if gpu_trouble(n) else 2
    return sorted(nodes, key=lambda n: (trouble(n), n.node_rank))


def _nodes(screen: Screen, nodes: Sequence[NodeNow], room: int) -> None:
    if not nodes:
        return
    room = max(3, room)
    host_width = min(max(6, *(len(n.host) for n in nodes)), max(8, screen.width - 68))
    screen.add((f"{'node':>4} {'host':<{host_width}} {'ranks':<7} {'state':<9} {'step':>6}  GPUs", "bold"))
    order = _node_order(nodes) if len(nodes) + sum(bool(gpu_trouble(n)) for n in nodes) > room - 1 else list(nodes)
    shown = 0
    for n in order:
        trouble = gpu_trouble(n)
        if shown + 1 + (1 if trouble else 0) > room - (1 if shown + 1 < len(order) else 0) - 1 and shown:
            break
        state_colour = STATE_COLOURS.get(n.state, "white")
        host = n.host if len(n.host) <= host_width else n.host[:host_width - 1] + "…"
        step = f"{n.step:,}" if n.step is not None else "-"
        screen.add(f"{n.node_rank:>4} {host:<{host_width}} {n.ranks or '-':<7} ", (f"{n.state:<9}", state_colour),
                   f" {step:>6}  ", (gpus_text(n.gpus), "red" if trouble else ""))
        if trouble:
            screen.add((f"{'':>5}└ {'; '.join(trouble)}", "bold red"))
        shown += 1
    if shown < len(order):
        rest = order[shown:]
        states = sorted({n.state for n in rest})
        screen.add((f"{'':>5}… {len(rest)} more node(s): {', '.join(states)}"
                    f"{'' if any(gpu_trouble(n) for n in rest) else ', no GPU slowdown'}", "dim"))


def _heat_height(snap: Snapshot, width: int) -> int:
    if not snap.ranks:
        return 0
    per_line = max(1, width // (6 + _windows(width)))
    groups = len(snap.ranks) if len(snap.ranks) <= per_line * 4 else len({r.node_rank for r in snap.ranks})
    return 1 + min(4, -(-groups // per_line))


def _windows(width: int) -> int:
    return 8 if width < 100 else 12


def _ranks(screen: Screen, snap: Snapshot, room: int) -> None:
    """Each rank's compute in the newest windows (x the window's median), folded by node when many."""
    if not snap.ranks or room < 2:
        return
    count = _windows(screen.width)
    cells = heat_cells(snap.ranks)
    per_line = max(1, screen.width // (6 + count))
    entries: list[tuple[str, list[Optional[float]]]]
    if len(snap.ranks) <= per_line * min(4, room - 1):
        entries = [(f"r{r.rank}", cells[r.rank]) for r in snap.ranks]
        title = "compute by rank, newest window right (x the window's median)"
    else:  # by node: the slowest of its ranks in each window
        by_node: dict[Any, list[list[Optional[float]]]] = {}
        for r in snap.ranks:
            by_node.setdefault(r.node_rank, []).append(cells[r.rank])
        entries = []
        for node_rank, rows in sorted(by_node.items(), key=lambda item: (item[0] is None, item[0] or 0)):
            width = max(len(row) for row in rows)
            worst = [max((row[i] for row in rows if i < len(row) and row[i] is not None), default=None)
                     for i in range(width)]
            entries.append((f"n{node_rank}", worst))
        title = "compute by node (its slowest rank), newest right (x the window's median)"
    lines = min(4, room - 1)
    if len(entries) > lines * per_line:  # the hottest only (in their order), and how many are left out
        keep = lines * per_line - 1
        hottest = sorted(range(len(entries)), key=lambda i: -max((c for c in entries[i][1][-count:] if c), default=0))
        chosen = sorted(hottest[:keep])
        title += f"; {keep} hottest of {len(entries)}"
        entries = [entries[i] for i in chosen]
    screen.add((title, "bold"))
    for start in range(0, len(entries), per_line):
        if lines <= 0:
            break
        text = Text(end="")
        for label, row in entries[start:start + per_line]:
            text.append(f"{label:>5} ")
            text.append_text(_heat(row, count))
        screen.add(text)
        lines -= 1


def _straggler(screen: Screen, snap: Snapshot) -> None:
    if snap.straggler:
        text = snap.straggler.get("text") or ""
        screen.add((text.split(" every rank waits")[0].rstrip(";"), "bold red"))
        if snap.straggler.get("cause"):
            screen.add(("  cause: " + snap.straggler["cause"], "red"))
    elif snap.ranks and len(snap.ranks) > 1:
        screen.add(("no straggler", "green"))


def _attempts(screen: Screen, snap: Snapshot) -> None:
    if snap.resize is not None:  # its own line: a run short of nodes is what the reader must see first
        screen.add(("elastic: " + snap.resize.describe(), "bold yellow"))
    parts = [f"{r.by} in the place of {r.host}" for r in snap.replacements]
    for earlier in snap.attempts:
        ended = f": {earlier.ended_by}" if earlier.ended_by else ""
        parts.append(f"attempt {earlier.attempt} {earlier.state}{ended}")
    if snap.recovery is not None:
        parts.append(snap.recovery.describe())
    if snap.hosts.spares:
        parts.append("spares: " + ", ".join(snap.hosts.spares))
    if snap.hosts.excluded:
        parts.append("excluded: " + ", ".join(f"{e['host']} ({e.get('reason', '')})" for e in snap.hosts.excluded))
    if parts:
        screen.add((" · ".join(parts), "yellow"))


def _logs(screen: Screen, snap: Snapshot, rank: Optional[int], node: Optional[int]) -> None:
    if screen.left < 2:
        return
    lines = [line for line in snap.logs if (rank is None or line.rank == rank) and
             (node is None or line.node_rank == node)]
    which = f"rank {rank}" if rank is not None else f"node {node}" if node is not None else "all ranks"
    screen.add((f"logs ({which})", "bold"))
    for line in lines[-screen.left:] if screen.left > 0 else []:
        label = f"[{line.host} r{line.rank}] " if line.rank is not None else f"[{line.host}] "
        screen.add((label, "cyan"), line.text)


def plain(snap: Snapshot, width: int = 100, height: int = 60, **kwargs: Any) -> str:
    """The screen as plain text (no colours): ``top --once`` into a pipe or a file."""
    return render(snap, width, height, keys=False, **kwargs).plain.rstrip() + "\n"


def clock(epoch: Optional[float]) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch)) if epoch else "-"
