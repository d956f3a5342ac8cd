"""One run directory here: creating it before anything starts, reading it back, and changing its record.

A run directory is self-describing: ``plan.json``, the rendered scripts, ``profile.yaml`` (the
profile as it was), ``inputs.json`` (what the plan was made from) and ``run.json`` (the record) are
all a later command needs to act on the run. ``RunDir.change`` (and ``change_if``, its conditional
form) is the only writer of run.json.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..plan.types import LaunchPlan, plan_from_json
from ..profiles.loader import parse_profile
from ..profiles.schema import ClusterProfile
from .index import last_metrics  # noqa: F401 - where the views and backends have always found it
from .paths import RunPaths, private_dir, read_json, write_json_atomic, write_private
from .record import RunRecord, now
from .timeline import Timeline

INPUTS = "inputs.json"
"""What the run's plan was made from (the overrides and make_plan's other inputs)."""


def write_attempt_files(paths: RunPaths, plan: LaunchPlan, scripts: dict[str, str]) -> None:
    """An attempt's plan and scripts in the run directory (private whatever the umask: code, outputs
    and logs are the user's alone)."""
    private_dir(paths.root).chmod(0o700)
    write_json_atomic(paths.plan, plan.to_json())
    private_dir(paths.scripts)
    for name, text in scripts.items():
        write_private(paths.script(name), text, 0o700)
    private_dir(paths.logs)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One change of run.json at a time, across processes (the launcher, a follower, ``stop``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
    def attempt(self) -> int:
        return self.plan.attempt

    @property
    def record(self) -> RunRecord:
        """run.json as it is now (another fsdpctl may have written it since)."""
        return RunRecord.from_json(read_json(self.paths.run_record), run_id=self.plan.run_id,
                                   profile=self.plan.profile_name, backend=self.plan.backend)

    @property
    def backend_name(self) -> str:
        """The backend that runs it, as run.json names it (older runs: as the plan does)."""
        return self.record.backend

    def change(self, **changes: Any) -> RunRecord:
        """Write ``changes`` (RunRecord fields; ``job``: the backend's own, merged) into run.json, under
        a lock, and return the record as it now is."""
        with _locked(self.root / ".run.json.lock"):
            record = self.record.replace(**changes)
            write_json_atomic(self.paths.run_record, record.to_json())
        return record

    def change_if(self, still: Callable[[RunRecord], bool], **changes: Any) -> RunRecord:
        """``change``, if ``still`` holds for run.json as it is under the lock: what a look at a live
        run learned must not overwrite what another process has recorded since (the run's end, a
        newer attempt). Returns the record as it now is, changed or not."""
        with _locked(self.root / ".run.json.lock"):
            record = self.record
            if not still(record):
                return record
            record = record.replace(**changes)
            write_json_atomic(self.paths.run_record, record.to_json())
        return record

    def add_timeline(self, timeline: Timeline, attempt: int) -> None:
        """Merge what ``timeline`` timed into run.json's (each process times its part of a launch),
        unless run.json has moved on to another attempt."""
        with _locked(self.root / ".run.json.lock"):
            record = self.record
            if record.attempt != attempt:
                return
            merged = timeline.merged(Timeline.from_json(record.timeline))
            write_json_atomic(self.paths.run_record, record.replace(timeline=merged.to_json()).to_json())

    def begin(self, record: RunRecord) -> RunRecord:
        """Write ``record`` as the whole of run.json (a new run, or a new attempt of it)."""
        with _locked(self.root / ".run.json.lock"):
            write_json_atomic(self.paths.run_record, record.to_json())
        return record


@contextlib.contextmanager
def attempt_lock(run: RunDir) -> Iterator[None]:
    """Held while a next attempt of ``run`` is planned and started: a second ``--resume`` of the same
    run at the same time is refused in one line (once the first has started, the run is live and
    a resume is refused for that)."""
    from ..errors import UsageError

    fd = os.open(run.root / ".attempt.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"run {run.run_id}: another fsdpctl is starting its next attempt now",
                             f"follow that one (`fsdpctl logs -f {run.run_id}`)") from None
        yield
    finally:
        os.close(fd)


def create_run(plan: LaunchPlan, profile: ClusterProfile, scripts: dict[str, str], profile_text: str,
               inputs: dict[str, Any] | None = None) -> RunDir:
    """The run directory here (``plan.local_run_dir``), written before anything starts. ``inputs``:
    what the plan was made from (``inputs.json``; a later attempt is planned from it)."""
    paths = RunPaths(Path(plan.local_run_dir))
    write_attempt_files(paths, plan, scripts)
    write_private(paths.root / "profile.yaml", profile_text)
    if inputs is not None:
        write_json_atomic(paths.root / INPUTS, inputs)
    run = RunDir(paths, plan, profile)
    run.begin(RunRecord(run_id=plan.run_id, profile=plan.profile_name, backend=plan.backend,
                        run_dir_on_nodes=plan.run_dir, num_nodes=plan.num_nodes, world_size=plan.world_size,
                        attempt=plan.attempt, secrets=plan.secrets, created_at=now()))
    return run


def load_run(run_dir: Path) -> RunDir:
    """A run directory back as a RunDir: its plan and the profile it was started with."""
    plan = plan_from_json(read_json(run_dir / "plan.json"))
    profile = parse_profile((run_dir / "profile.yaml").read_text(encoding="utf-8"), str(run_dir / "profile.yaml"))
    return RunDir(RunPaths(run_dir), plan, profile)
