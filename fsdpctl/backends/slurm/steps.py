"""What a Slurm job with spare nodes (or an elastic one) did: the events ``fsdpctl.node.slurm_steps``
appended to ``slurm-steps.jsonl`` in the shared run directory, as the replacements, the resize and
the recovery ``status`` shows (which node failed, which spare took its place or how many nodes the
job went on with, how long the training stood still)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from ...node.events import BATCH_SPLIT, event_name
from ...node.slurm_steps import EVENTS_FILE
from ...rundir.status import Recovery, Replacement, Resize

CHANGED = ("replaced", "shrunk")
"""The events after which a step runs on other nodes than the failed one, from the newest checkpoint."""


def metrics_text(run_dir: Path) -> str:
    """The run's metrics.jsonl ("" before rank 0 wrote one)."""
    path = run_dir / "metrics.jsonl"
    return path.read_text(encoding="utf-8") if path.exists() else ""


def spare_changes(run_dir: Path, metrics: str) -> dict[str, Any]:
    """What a job with spares (or an elastic one) changed on the way, as run.json and ``status`` keep
    it: the spares in failed nodes' places (``replacements``), the newest shrink (``resize``) and what
    the newest change cost (``recovery``); ``metrics`` is metrics.jsonl's text."""
    events, rows = read_events(run_dir), json_lines(metrics)
    return {"replacements": replacements_of(events), "recovery": recovery_of(events, rows),
            "resize": resize_of(events, rows)}


def step_hosts(run_dir: Path) -> list[str]:
    """The hosts of the job's newest step, in rank order (empty: a job that runs no steps of its own)."""
    steps = [e for e in read_events(run_dir) if e.get("event") == "step" and e.get("hosts")]
    return list(steps[-1]["hosts"]) if steps else []


def step_nodes(run_dir: Path, planned: int) -> int:
    """The nodes the job's newest step runs on (an elastic job's may be fewer than ``planned``):
    node<R>.log of a rank beyond them is an earlier step's."""
    hosts = step_hosts(run_dir)
    return min(len(hosts), planned) if hosts else planned


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
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def replacements_of(events: list[dict[str, Any]]) -> tuple[Replacement, ...]:
    """Every spare that took a failed node's place, in order."""
    return tuple(Replacement.from_json(r) for e in events if e.get("event") in CHANGED
                 for r in e.get("replacements") or ())


def resize_of(events: list[dict[str, Any]], metrics: Sequence[dict[str, Any]] = ()) -> Optional[Resize]:
    """The newest shrink of an elastic job (None: none), with how the bundled workload kept its
    global batch there where its rows say (``metrics``: metrics.jsonl's rows)."""
    shrunk = next((e for e in reversed(events) if e.get("event") == "shrunk"), None)
    if shrunk is None:
        return None
    return Resize(nodes=int(shrunk["nodes"]), before=int(shrunk.get("before") or shrunk["nodes"]),
                  full=int(shrunk.get("full") or shrunk["nodes"]), hosts=tuple(shrunk.get("out") or ()),
                  why=str(shrunk.get("why") or ""), batch=kept_batch(metrics, shrunk))


def kept_batch(metrics: Sequence[dict[str, Any]], shrunk: dict[str, Any]) -> Optional[str]:
    """``global batch 8 kept: batch 4 x accumulation 2 per rank``: how the bundled workload split it on
    the nodes a shrink left, from its ``BATCH_SPLIT`` row of that size (its ranks in the same share of
    the full world as the nodes: a Slurm job only shrinks, so one size is one step); None: not written
    yet, or another program."""
    nodes, full = shrunk.get("nodes"), shrunk.get("full") or shrunk.get("nodes")
    if not isinstance(nodes, int) or not isinstance(full, int):
        return None
    for row in reversed(metrics):
        world, ranks = row.get("world"), row.get("full")
        if event_name(row) == BATCH_SPLIT and isinstance(world, int) and isinstance(ranks, int) \
                and world * full == ranks * nodes:
            text = row.get("text")
            return text if isinstance(text, str) else None
    return None


def recovery_of(events: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> Optional[Recovery]:
    """The newest replacement's (or shrink's) cost: from the failed step's last training step to the
    next step's first (metrics.jsonl's times), and the steps trained again (from the checkpoint it resumed)."""
    replaced = next((i for i in range(len(events) - 1, -1, -1) if events[i].get("event") in CHANGED), None)
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
