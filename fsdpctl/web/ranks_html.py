"""``report --html``'s table of every rank of each run, as ``fsdpctl report`` prints it (the same
columns and cells: ``fsdpctl.metrics.rank_table``), every rank shown.

It is written into the page as HTML, every text in it escaped (a host name is whatever a profile or a
node said); the page's script moves each run's table under that run's summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from ..metrics.rank_table import HEADING, UNTIMED_NOTE, cells, columns, has_untimed


def ranks_panels(summaries: Sequence[Any]) -> str:
    """A panel per run with per-rank figures (``RunSummary``s in; none: "")."""
    return "".join(_panel(s.name, s.ranks) for s in summaries if s.ranks)


def _panel(run_id: str, ranks: Sequence[dict[str, Any]]) -> str:
    untimed = has_untimed(ranks)
    head = "".join(f"<th>{escape(name)}</th>" for name in [*columns(ranks), ""])
    rows = []
    for entry in ranks:
        mark = "straggler" if entry.get("straggler") else ""
        row = "".join(f"<td>{escape(value)}</td>" for value in cells(entry, untimed))
        row += f'<td class="straggler">{mark}</td>' if mark else "<td></td>"
        rows.append(f'<tr data-rank="{escape(str(entry.get("rank")))}">{row}</tr>')
    note = f'<p class="dim">{escape(UNTIMED_NOTE)}</p>' if untimed else ""
    title = escape(HEADING.rstrip(":"))
    # (no white space between the wrapper and its table: the page's checks take its first child)
    return (f'<div class="panel ranks-panel" id="ranks" data-run="{escape(run_id)}"><h2>{title}</h2>'
            f'<div class="table-wrap"><table id="ranks-table"><tr>{head}</tr>{"".join(rows)}</table></div>'
            f"{note}</div>")
