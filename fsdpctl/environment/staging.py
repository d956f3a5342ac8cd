"""An environment for a Slurm job: its nodes are known only once allocated, so it is resolved for the
platform their last check reported (``doctor``), and its wheels, uv and the request go into the run
directory on shared storage; the job's first step makes it on every node (``fsdpctl.node.envs``)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..plan.environment import STAGED_ENVIRONMENT
from ..plan.types import LaunchPlan
from . import resolve as resolving
from . import wheels as store
from .nodes import CannotMake, NodeEnv, resolve_for, uv_for
from .uv import uv_version

# The CUDA version a driver supports at least, by its major version (NVIDIA's table).
_DRIVER_CUDA = ((580, 13000), (575, 12090), (570, 12080), (560, 12060), (550, 12040), (530, 12010), (520, 11080))


def cuda_of_driver(driver: str | None) -> int | None:
    """``570.133.20`` -> 12080."""
    major = (driver or "").split(".")[0]
    if not major.isdigit():
        return None
    return next((cuda for least, cuda in _DRIVER_CUDA if int(major) >= least), None)


def platform_facts(profile_name: str) -> dict[str, Any]:
    """The nodes' platform as their last check saw it; refused when none was seen or they differ."""
    from ..hostpool.findings import last_findings

    seen = {host: found["platform"] for host, found in last_findings(profile_name).items()
            if found.get("platform")}
    if not seen:
        raise UsageError(f"environment: the nodes of profile {profile_name} were never checked, and a Slurm job's "
                         f"nodes are known only once allocated", f"run `fsdpctl doctor -p {profile_name}` once: it "
                         f"learns their Python and platform, which the environment is resolved for")
    kinds = {json.dumps({k: v for k, v in p.items() if k not in ("driver", "gpus")}, sort_keys=True): host
             for host, p in seen.items()}
    if len(kinds) > 1:
        shown = "; ".join(f"{host}: {json.loads(kind)['python']} on {json.loads(kind)['machine']}"
                          for kind, host in kinds.items())
        raise UsageError(f"environment: the profile's nodes differ in Python or platform ({shown})",
                         "give each kind of node a profile (and partition) of its own")
    first = next(iter(seen.values()))
    return {"python": first["python"], "executable": first["executable"], "machine": first["machine"],
            "glibc": first["glibc"], "implementation": first.get("implementation") or "cpython",
            "cuda_driver": cuda_of_driver(first.get("driver")) if first.get("gpus") else None}


def _place(source: Path, target: Path) -> None:
    """A file into the run directory: linked where the file system allows, else copied."""
    if target.exists():
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def stage_environment(plan: LaunchPlan, profile_name: str) -> NodeEnv:
    """Resolve the plan's environment for the nodes' platform and put what the job's first step needs
    in ``<run dir>/environment``: ``request.json``, the wheels, and uv."""
    from ..rundir.paths import private_dir

    env = plan.environment
    assert env is not None
    facts = platform_facts(profile_name)
    try:
        target, wheels = resolve_for(env, facts)
    except CannotMake as exc:
        raise UsageError(f"environment (on the nodes doctor checked): {exc.detail}", exc.hint) from None
    folder = Path(plan.run_dir).expanduser() / STAGED_ENVIRONMENT
    private_dir(folder / "wheels")  # the run directory's, this user's only
    key = resolving.env_key(wheels, facts)
    request: dict[str, Any] = {"key": key, "name": env.name, "keep": env.keep, "source": env.source,
                               "wheels": [w.as_json() for w in wheels]}
    staged = 0
    for wheel in wheels:
        path = store.fetch(wheel)
        _place(path, folder / "wheels" / wheel.file)
        staged += path.stat().st_size
    binary, uv_wheel = uv_for(env, target, facts)
    if binary is not None:
        shutil.copyfile(binary, folder / "uv")
        os.chmod(folder / "uv", 0o755)  # noqa: S103 - a program the nodes run
        request["uv_binary"] = {"version": uv_version()}
    else:
        assert uv_wheel is not None
        _place(store.fetch(uv_wheel), folder / "wheels" / uv_wheel.file)
        request["uv_wheel"] = {**uv_wheel.as_json(), "version": uv_version()}
    (folder / "request.json").write_text(json.dumps(request, indent=1), encoding="utf-8")
    return NodeEnv(0, "slurm", key, target.describe(), True, "staged", staged, 0.0)
