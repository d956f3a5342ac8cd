"""The dashboard's data and actions by path: each answers (HTTP status, JSON-ready data). Runs are found
by their exact id inside the runs directory and nowhere else; profiles by a valid name only."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..profiles.schema import NAME_PATTERN
from ..rundir.paths import RUN_ID_PATTERN
from .data import hosts_page, script_text


def find_run(runs_dir: Path, run_id: str) -> Optional[Any]:
    """The run ``run_id`` (an exact id, a directory of the runs directory), or None."""
    if not RUN_ID_PATTERN.match(run_id):
        return None
    path = runs_dir / run_id
    try:
        if path.resolve().parent != runs_dir.resolve() or not (path / "plan.json").is_file():
            return None
    except OSError:
        return None
    from ..api.run import Run
    from ..rundir.rundir import load_run

    return Run(load_run(path))


def get(server: Any, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
    parts = [p for p in path.split("/") if p]
    if parts[:2] != ["api", "runs"] and parts[:2] != ["api", "hosts"]:
        return 404, {"error": "no such page"}
    if parts == ["api", "runs"]:
        rows = server.hub.runs_payload().data["runs"]
        for key in ("state", "profile"):
            wanted = query.get(key, [None])[0]
            if wanted:
                rows = [r for r in rows if r[key] == wanted]
        return 200, {"runs": rows}
    if parts[:2] == ["api", "hosts"] and len(parts) == 3:
        if not NAME_PATTERN.match(parts[2]):
            return 404, {"error": "no such profile"}
        from ..errors import FsdpctlError

        try:
            return 200, hosts_page(parts[2], server.hub.index)
        except FsdpctlError as exc:
            return 404, {"error": exc.message}
    run = find_run(server.runs_dir, parts[2]) if len(parts) >= 3 else None
    if run is None:
        return 404, {"error": "no such run"}
    if len(parts) == 3:
        payload = server.hub.run_payload(run)
        return 200, payload.data
    if len(parts) == 5 and parts[3] == "nodes":
        if not parts[4].isdigit() or len(parts[4]) > 6:
            return 404, {"error": "no such node"}
        return 200, server.hub.node_charts(run, int(parts[4]))
    if len(parts) == 5 and parts[3] == "scripts":
        text = script_text(run, parts[4])
        return (200, {"name": parts[4], "text": text}) if text is not None else (404, {"error": "no such script"})
    return 404, {"error": "no such page"}


def post(server: Any, path: str) -> tuple[int, Any]:
    """The actions: stop a run, read every rank's stack, profile a few steps (``fsdpctl profile``)."""
    from ..errors import FsdpctlError

    parts = [p for p in path.split("/") if p]
    if len(parts) != 4 or parts[:2] != ["api", "runs"] or parts[3] not in ("stop", "stacks", "profile"):
        return 404, {"error": "no such action"}
    run = find_run(server.runs_dir, parts[2])
    if run is None:
        return 404, {"error": "no such run"}
    try:
        with run:
            if parts[3] == "stop":
                remaining = run.stop()
                left = {host: pids for host, pids in remaining.items() if pids}
                return 200, {"stopped": not left, "remaining": left}
            if parts[3] == "profile":
                return 200, {"lines": run.trace_steps().lines()}
            report = run.stacks()
            return 200, {"lines": report.render()}
    except FsdpctlError as exc:
        return 409, {"error": exc.message, "hint": exc.hint}
