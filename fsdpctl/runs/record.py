"""A run directory's record: writing it when a run is created, ``run.json`` as the run goes, reading it back.

``run.json`` names the backend once (``backend``); with ``plan.json`` and the profile as it was
(``profile.yaml``) it is all a later command needs to act on the run.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from ..plan.types import LaunchPlan, plan_from_json
from ..profiles.loader import parse_profile
from ..profiles.schema import ClusterProfile
from .paths import RunPaths, read_json, write_json_atomic


def now() -> str:
    """The time, as run.json records it."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def record(paths: RunPaths, plan: LaunchPlan, nodes: list[dict[str, Any]] | None, state: str,
           **extra: Any) -> dict[str, Any]:
    """Write run.json: the run's state, each node's process id and state, and whatever ``extra`` says."""
    data = read_json(paths.run_record)
    data.update({
        "run_id": plan.run_id, "profile": plan.profile_name, "backend": plan.backend, "state": state,
        "run_dir_on_nodes": plan.run_dir, "num_nodes": plan.num_nodes, "world_size": plan.world_size,
    })
    if nodes is not None:
        data["nodes"] = nodes
    data.update(extra)
    write_json_atomic(paths.run_record, data)
    return data


def prepare(paths: RunPaths, plan: LaunchPlan, scripts: dict[str, str], profile_text: str) -> None:
    """The local run directory: plan, scripts, the profile as it was, and a first run.json."""
    write_json_atomic(paths.plan, plan.to_json())
    paths.scripts.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        paths.script(name).write_text(text, encoding="utf-8")
    (paths.root / "profile.yaml").write_text(profile_text, encoding="utf-8")
    paths.logs.mkdir(parents=True, exist_ok=True)
    record(paths, plan, None, "starting", created_at=now())


def load_run(run_dir: Path) -> tuple[LaunchPlan, ClusterProfile, dict[str, Any]]:
    """A run directory's plan (as a LaunchPlan), its profile, and run.json."""
    plan = plan_from_json(read_json(run_dir / "plan.json"))
    profile = parse_profile((run_dir / "profile.yaml").read_text(encoding="utf-8"), str(run_dir / "profile.yaml"))
    return plan, profile, read_json(run_dir / "run.json")
