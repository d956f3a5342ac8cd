"""``fsdpctl report --html FILE``: finished runs' pages (the dashboard's charts, nodes, attempts, lines
and plan; several runs compared first, their curves by step overlaid on one chart each, one series per
run) in one self-contained file that opens without any network: the chart library, the page's
script and style are inside it, and a Content-Security-Policy in it forbids loading anything else.

The runs' data goes in as JSON inside a ``<script type="application/json">`` element, with ``<``, ``>``
and ``&`` written as escapes, so nothing a run wrote can end the element or become markup; the page
reads it with ``JSON.parse`` and shows it as text, as the dashboard does. Each run's table of ranks
goes in as HTML with every text escaped (``fsdpctl.web.ranks_html``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..rundir.record import now
from .data import run_page
from .ranks_html import ranks_panels

STATIC = Path(__file__).resolve().parent / "static"
CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"


def embedded_json(data: Any) -> str:
    """JSON that can sit inside a ``<script>`` element whatever its strings hold (``<``, ``>``, ``&``
    as escapes); the dashboard sends its data so too, whatever a browser makes of a response."""
    text = json.dumps(data, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def run_report_data(run: Any, metrics: list[Path], gpus: list[Path]) -> dict[str, Any]:
    """One finished run as its page draws it: the final snapshot, the charts over its whole length
    (from ``metrics`` and ``gpus``), the plan."""
    from ..live.charts import ChartStore

    snapshot = next(run.watch())
    charts = ChartStore(run.path, run.plan, run.plan.world_size, sources=(metrics, gpus), whole=True)
    charts.update()
    from ..accounting.cache import counted_json

    return {**run_page(run, snapshot.to_json(), counted_json(run)), "charts": charts.to_json()}


def write_report(path: Path, runs: list[dict[str, Any]], summaries: Sequence[Any] = ()) -> Path:
    """The file: ``runs`` (``run_report_data`` each), compared on overlaid charts when there are several,
    then each run's page one under another (the page's script, ``app.js``, draws them), with the table
    of ranks of each of ``summaries`` (``RunSummary``s) that has one."""
    style = (STATIC / "vendor" / "uplot" / "uPlot.min.css").read_text() + (STATIC / "style.css").read_text()
    script = (STATIC / "vendor" / "uplot" / "uPlot.iife.min.js").read_text() + "\n" + (STATIC / "app.js").read_text()
    style = style.replace("</", "<\\/")  # nothing in it may end the <style> element early
    script = script.replace("</script", "<\\/script")
    data = embedded_json({"written": now(), "runs": runs})
    page = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>fsdpctl report</title>
<style>{style}</style>
</head>
<body>
<header><span>fsdpctl report</span><nav id="crumbs"></nav><span id="connection" class="dim"></span></header>
<main id="main"></main>
<div id="ranks-tables">{ranks_panels(summaries)}</div>
<script type="application/json" id="fsdpctl-report">{data}</script>
<script>{script}</script>
</body>
</html>
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
