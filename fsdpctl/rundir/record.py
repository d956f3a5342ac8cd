"""A run directory's record: writing it when a run is created, ``run.json`` as the run goes, reading it back.

``run.json`` names the backend once (``backend``); with ``plan.json`` and the profile as it was
(``profile.yaml``) it is all a later command needs to act on the run.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..plan.types import LaunchPlan, plan_from_json
from ..profiles.loader import parse_profile
from ..profiles.schema import ClusterProfile
from .paths import RunPaths, private_dir, read_json, write_json_atomic, write_private


def now() -> str:
    """The time, as run.json records it."""
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def record(paths: RunPaths, plan: LaunchPlan, nodes: list[dict[str, Any]] | None, state: str,
           **extra: Any) -> dict[str, Any]:
    """Write run.json: the run's state, each node's process id and state, and whatever ``extra`` says."""
    data = read_json(paths.run_record)
    data.update({
        "run_id": plan.run_id, "profile": plan.profile_name, "backend": plan.backend, "state": str(state),
        "run_dir_on_nodes": plan.run_dir, "num_nodes": plan.num_nodes, "world_size": plan.world_size,
        "attempt": plan.attempt,
    })
    if plan.secrets:
        data["secrets"] = {name: "<secret>" for name in plan.secrets}  # names only: values are written nowhere
    if nodes is not None:
        data["nodes"] = nodes
    data.update(extra)
    write_json_atomic(paths.run_record, data)
    return data


def prepare(paths: RunPaths, plan: LaunchPlan, scripts: dict[str, str], profile_text: str | None) -> None:
    """The local run directory: plan, scripts, the profile as it was (None: keep the one there), and
    run.json, starting."""
    private_dir(paths.root).chmod(0o700)  # whatever the umask: code, outputs and logs are the user's alone
    write_json_atomic(paths.plan, plan.to_json())
    private_dir(paths.scripts)
    for name, text in scripts.items():
        write_private(paths.script(name), text, 0o700)
    if profile_text is not None:
        write_private(paths.root / "profile.yaml", profile_text)
    private_dir(paths.logs)
    record(paths, plan, None, "starting", **({"created_at": now()} if profile_text is not None else {}))


@dataclass(frozen=True)
class RunDir:
    """One run directory here: its plan and the profile as it was; ``record`` reads run.json afresh."""

    paths: RunPaths
    plan: LaunchPlan
    profile: ClusterProfile

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    @property
    def record(self) -> dict[str, Any]:
        """run.json as it is now (another fsdpctl may have written it since)."""
        return read_json(self.paths.run_record)

    @property
    def attempt(self) -> int:
        return self.plan.attempt

    @property
    def backend_name(self) -> str:
        """The backend that runs it, as run.json names it (older runs: as the plan does)."""
        return self.record.get("backend") or self.plan.backend

    def update(self, state: str, nodes: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
        """Write the run's state (and each node's, and ``extra``) into run.json."""
        return record(self.paths, self.plan, nodes, state, **extra)


def create_run(plan: LaunchPlan, profile: ClusterProfile, scripts: dict[str, str], profile_text: str,
               inputs: dict[str, Any] | None = None) -> RunDir:
    """The run directory here (``plan.local_run_dir``), written before anything starts. ``inputs``:
    what the plan was made from (``inputs.json``; a later attempt is planned from it)."""
    paths = RunPaths(Path(plan.local_run_dir))
    prepare(paths, plan, scripts, profile_text)
    if inputs is not None:
        write_json_atomic(paths.root / "inputs.json", inputs)
    return RunDir(paths, plan, profile)


def load_run(run_dir: Path) -> RunDir:
    """A run directory back as a Run: its plan and the profile it was started with."""
    plan = plan_from_json(read_json(run_dir / "plan.json"))
    profile = parse_profile((run_dir / "profile.yaml").read_text(encoding="utf-8"), str(run_dir / "profile.yaml"))
    return RunDir(RunPaths(run_dir), plan, profile)


def last_metrics(texts: list[str]) -> dict[str, Any] | None:
    """The newest training metrics line (one with a loss) in the first text that has one."""
    for text in texts:
        for line in reversed(text.strip().splitlines()):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and "loss" in data:
                return data
    return None
