"""Excluded hosts, remembered per profile in fsdpctl's state on this machine: which host, why, by
which run and since when. The next launch of the profile uses a spare in an excluded host's place
until ``fsdpctl hosts --restore`` puts the host back.

The file is ``$FSDPCTL_STATE_DIR/hosts/<profile>.json`` (default ``$XDG_STATE_HOME/fsdpctl``, else
``~/.local/state/fsdpctl``); changes are made under a lock, written whole and renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

STATE_DIR_ENV = "FSDPCTL_STATE_DIR"


@dataclass(frozen=True)
class Exclusion:
    """A host left out of every run of a profile until it is restored."""

    host: str
    reason: str
    run_id: Optional[str]
    """The run whose failure excluded it (None: excluded by hand)."""
    since: str

    def to_json(self) -> dict[str, Optional[str]]:
        return {"host": self.host, "reason": self.reason, "run_id": self.run_id, "since": self.since}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Exclusion:
        run_id = data.get("run_id")
        return cls(host=str(data.get("host")), reason=str(data.get("reason") or ""),
                   run_id=str(run_id) if run_id else None, since=str(data.get("since") or ""))


def state_dir(env: Optional[Mapping[str, str]] = None) -> Path:
    """Where fsdpctl keeps what it remembers on this machine."""
    env = os.environ if env is None else env
    if env.get(STATE_DIR_ENV):
        return Path(env[STATE_DIR_ENV]).expanduser()
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME") or "~").expanduser() / ".local" / "state")
    return Path(base) / "fsdpctl"


def exclusions_file(profile_name: str, env: Optional[Mapping[str, str]] = None) -> Path:
    return state_dir(env) / "hosts" / f"{profile_name}.json"


def read_exclusions(profile_name: str, env: Optional[Mapping[str, str]] = None) -> dict[str, Exclusion]:
    """The profile's excluded hosts by host (empty when none, or when the file cannot be read)."""
    return _read(exclusions_file(profile_name, env))


def add_exclusions(profile_name: str, exclusions: Iterable[Exclusion],
                   env: Optional[Mapping[str, str]] = None) -> dict[str, Exclusion]:
    """Remember ``exclusions`` (a host already excluded keeps its first reason); all of them now."""
    with _changing(exclusions_file(profile_name, env)) as found:
        for exclusion in exclusions:
            found.setdefault(exclusion.host, exclusion)
        return dict(found)


def remove_exclusion(profile_name: str, host: str, env: Optional[Mapping[str, str]] = None) -> Optional[Exclusion]:
    """Forget ``host``'s exclusion; the exclusion that was (None: it was not excluded)."""
    with _changing(exclusions_file(profile_name, env)) as found:
        return found.pop(host, None)


def _read(path: Path) -> dict[str, Exclusion]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    items = data.get("excluded") if isinstance(data, dict) else None
    found = [Exclusion.from_json(item) for item in items or () if isinstance(item, dict) and item.get("host")]
    return {e.host: e for e in found}


@contextlib.contextmanager
def _changing(path: Path) -> Iterator[dict[str, Exclusion]]:
    """The exclusions, to change in place, written back when the block ends (one writer at a time)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _read(path)
        yield found
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"excluded": [e.to_json() for e in found.values()]}, indent=2) + "\n",
                       encoding="utf-8")
        os.replace(tmp, path)
