"""The last doctor's word on each host of a profile, remembered on this machine (``doctor``, ``doctor
--health`` and every launch's preflight write it; the dashboard's hosts page reads it):
``$FSDPCTL_STATE_DIR/doctor/<profile>.json``, one entry per host, the newest check of each host kept."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from .store import state_dir


def findings_file(profile_name: str, env: Optional[Mapping[str, str]] = None) -> Path:
    return state_dir(env) / "doctor" / f"{profile_name}.json"


def last_findings(profile_name: str, env: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
    """Per host: when it was checked, by what (``doctor``, ``doctor --health``, a run's preflight),
    its status and the checks that did not pass ({} when none was remembered)."""
    try:
        data = json.loads(findings_file(profile_name, env).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember_findings(profile_name: str, report: Mapping[str, Any], by: str, when: str,
                      env: Optional[Mapping[str, str]] = None) -> None:
    """Keep ``report`` (a DoctorReport's ``to_json``) as each of its hosts' newest check; never fails
    the caller (what cannot be written is only not remembered)."""
    path = findings_file(profile_name, env)
    with contextlib.suppress(OSError):
        found = last_findings(profile_name, env)
        for host in report.get("hosts") or ():
            found[str(host.get("host"))] = {
                "at": when, "by": by, "status": host.get("status"),
                "checks": [{"name": c.get("name"), "status": c.get("status"), "detail": c.get("detail")}
                           for c in host.get("checks") or () if c.get("status") != "pass"],
                **({"platform": platform} if (platform := platform_of(host.get("facts"))) else {})}
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as handle:
            json.dump(found, handle, indent=1)
        os.replace(tmp, path)


def platform_of(facts: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """What an environment is resolved for, from a probe's facts: the Python, the machine, glibc, the
    GPU driver (a Slurm job's nodes are known only once allocated: their last check speaks for them)."""
    if not facts or not facts.get("platform"):
        return None
    own = facts["platform"]
    return {"python": (facts.get("python") or {}).get("version"), "executable": own.get("executable"),
            "machine": own.get("machine"), "glibc": own.get("glibc"), "implementation": own.get("implementation"),
            "driver": (facts.get("gpus") or {}).get("driver"), "gpus": (facts.get("gpus") or {}).get("count")}
