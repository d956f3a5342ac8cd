"""What a Slurm job with spare nodes did: the events ``fsdpctl.node.slurm_steps`` appended to
``slurm-steps.jsonl`` in the shared run directory, as the replacements and the recovery ``status``
shows (which node failed, which spare took its place, how long the training stood still)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ...node.slurm_steps import EVENTS_FILE
from ...rundir.status import Recovery, Replacement


def metrics_text(run_dir: Path) -> str:
    """The run's metrics.jsonl ("" before rank 0 wrote one)."""
    path = run_dir / "metrics.jsonl"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def spare_changes(run_dir: Path, metrics: str) -> dict[str, Any]:
    """What a job with spares changed on the way, as run.json and ``status`` keep it: the spares in
    failed nodes' places (``replacements``) and what the newest one cost (``recovery``); ``metrics``
    is metrics.jsonl's text."""
    events = read_events(run_dir)
    return {"replacements": replacements_of(events), "recovery": recovery_of(events, json_lines(metrics))}


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The job's step events, oldest first (a line cut short by a crash is skipped)."""
    try:
        text = (run_dir / EVENTS_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    return json_lines(text)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The objects of a JSON-lines text (metrics.jsonl, the step events); a line cut short is skipped."""
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def replacements_of(events: list[dict[str, Any]]) -> tuple[Replacement, ...]:
    """Every spare that took a failed node's place, in order."""
    return tuple(Replacement.from_json(r) for e in events if e.get("event") == "replaced"
                 for r in e.get("replacements") or ())


def recovery_of(events: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> Optional[Recovery]:
    """The newest replacement's cost: from the failed step's last training step to the next step's
    first (metrics.jsonl's times), and the steps trained again (from the checkpoint it resumed)."""
    replaced = next((i for i in range(len(events) - 1, -1, -1) if events[i].get("event") == "replaced"), None)
    if replaced is None or replaced == 0 or events[replaced - 1].get("event") != "failed":
        return None
    failed, again = events[replaced - 1], events[replaced]
    last_at, last_step, from_step = failed.get("last_step_at"), failed.get("last_step"), again.get("from_step")
    if last_at is None:
        return None
    first = next((row for row in metrics if row.get("kind") == "train" and (row.get("time") or 0) > last_at
                  and _after(row, again)), None)
    if first is None:
        return None
    redone = last_step - from_step if last_step is not None and from_step is not None else None
    return Recovery(stood_still_s=float(first["time"]) - float(last_at), steps_redone=redone)


def _after(row: dict[str, Any], event: dict[str, Any]) -> bool:
    """The metrics row was written after the event."""
    return event.get("at_s") is None or float(row.get("time") or 0) >= float(event["at_s"])
