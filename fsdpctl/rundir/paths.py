"""Run ids and the layout of a run's local directory, in one place.

A run directory is self-describing: ``plan.json``, the rendered scripts, ``run.json`` and the
collected logs are all that ``logs``/``status`` need.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUN_ID_PATTERN = re.compile(r"^(?P<profile>[A-Za-z0-9][A-Za-z0-9_.-]*)-(?P<stamp>\d{8}-\d{6})-(?P<token>[0-9a-f]{4})$")
RUNS_DIR_ENV = "FSDPCTL_RUNS_DIR"


def make_run_id(profile_name: str, now: _dt.datetime, token: str) -> str:
    """``<profile>-<yyyymmdd-hhmmss>-<4 hex>``; pure (the caller supplies time and token)."""
    if not re.fullmatch(r"[0-9a-f]{4}", token):
        raise ValueError(f"run id token must be 4 hex digits, got {token!r}")
    return f"{profile_name}-{now.strftime('%Y%m%d-%H%M%S')}-{token}"


_ISSUED: set[str] = set()


def new_run_id(profile_name: str, taken: Path | None = None) -> str:
    """A fresh run id from the clock and 16 random bits, never one this process gave before nor one
    with a directory in ``taken`` (a sweep started in one second would otherwise share a directory
    now and then: 50 runs in a second meet with a chance of 2%)."""
    import secrets  # here: listing runs never pays for it

    while True:
        run_id = make_run_id(profile_name, _dt.datetime.now(), secrets.token_hex(2))
        if run_id not in _ISSUED and (taken is None or not (taken / run_id).exists()):
            _ISSUED.add(run_id)
            return run_id


def runs_root(env: dict[str, str] | None = None, cwd: Path | None = None) -> Path:
    """Where local run directories live: ``$FSDPCTL_RUNS_DIR``, else ``./runs``."""
    env = os.environ if env is None else env
    if env.get(RUNS_DIR_ENV):
        return Path(env[RUNS_DIR_ENV]).expanduser()
    return (cwd or Path.cwd()) / "runs"


@dataclass(frozen=True)
class RunPaths:
    """The files of one run's local directory."""

    root: Path

    @property
    def plan(self) -> Path:
        return self.root / "plan.json"

    @property
    def run_record(self) -> Path:
        return self.root / "run.json"

    @property
    def scripts(self) -> Path:
        return self.root / "scripts"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def script(self, name: str) -> Path:
        return self.scripts / name


def private_dir(path: Path) -> Path:
    """``path`` as a folder readable by this user only (0700), its missing parents too, whatever the
    umask of the process (a notebook's is usually 022): runs hold code, outputs and what ranks print."""
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            continue
        folder.chmod(0o700)
    return path


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write a file readable by this user only (``mode``), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with open(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), mode)
        handle.write(text)


def write_json_atomic(path: Path, data: Any, compact: bool = False) -> None:
    """Write JSON so that a reader never sees a half-written file (readable by this user only);
    ``compact``: on one line (files written every second, which people rarely read)."""
    if not compact:
        private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=2, sort_keys=False)
    write_private(tmp, text + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file written by fsdpctl; {} when missing or unreadable (a run being created)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def files_under(path: Path, skip: tuple[str, ...] = ()) -> list[str]:
    """``path`` itself when it is a file, every file below it when it is a folder (but those in its
    top-level folders named in ``skip``), else nothing."""
    if path.is_dir():
        return [str(p) for p in sorted(path.rglob("*")) if p.is_file() and p.relative_to(path).parts[0] not in skip]
    return [str(path)] if path.exists() else []


def list_runs(root: Path | None = None) -> list[Path]:
    """Run directories under the runs root, oldest first (by the time in the run id)."""
    root = root or runs_root()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and RUN_ID_PATTERN.match(p.name) and (p / "plan.json").exists()]
    return sorted(found, key=lambda p: (RUN_ID_PATTERN.match(p.name)["stamp"], p.stat().st_mtime))


def find_run(run_id: str | None, root: Path | None = None) -> Path:
    """The directory of ``run_id`` (the latest run when None); raises UsageError when there is none."""
    from ..errors import UsageError

    root = root or runs_root()
    runs = list_runs(root)
    if run_id is None:
        if not runs:
            raise UsageError(f"no runs in {root}", "start one with `fsdpctl launch`, or set FSDPCTL_RUNS_DIR")
        return runs[-1]
    matches = [p for p in runs if p.name == run_id] or [p for p in runs if p.name.startswith(run_id)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UsageError(f"run {run_id}: not found in {root}", "list runs with `fsdpctl runs`")
    raise UsageError(f"run {run_id}: matches {len(matches)} runs", "give more of the run id")
