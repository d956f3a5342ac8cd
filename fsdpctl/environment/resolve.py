"""An environment resolved for one node platform: exactly one wheel per package, each with its URL and
sha256. Resolutions are kept on this machine by their inputs, so a launch that changes nothing resolves
nothing (and a requirement that names no version keeps the one it got until its file changes)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import unquote

import tomllib

from ..plan.environment import EnvPlan
from . import uv

# The CUDA builds uv knows for torch, newest first, by the driver version that runs them.
_TORCH_CUDA = ((13020, "cu132"), (13000, "cu130"), (12090, "cu129"), (12080, "cu128"), (12060, "cu126"),
               (12040, "cu124"), (12010, "cu121"), (11080, "cu118"))
# Platforms uv resolves for by glibc version (x86_64-manylinux_2_28 ...): older ones stand for 2_17.
_GLIBC = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)


@dataclass(frozen=True)
class Target:
    """A node platform as uv resolves for it."""

    python: str
    """``3.11``."""
    platform: str
    """``x86_64-manylinux_2_36``."""
    torch_backend: Optional[str]
    """``cu128``, ``cpu``, or None: what the indexes give."""

    def describe(self) -> str:
        torch = f", torch {self.torch_backend}" if self.torch_backend else ""
        return f"Python {self.python} on {self.platform}{torch}"


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    file: str
    url: str
    sha256: str
    size: Optional[int]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "file": self.file, "url": self.url,
                "sha256": self.sha256, "size": self.size}


class TargetError(Exception):
    """A node whose platform no environment can be made for."""


def target_of(facts: dict[str, Any], torch_backend: str, locked: bool) -> Target:
    """The platform a node's facts describe. ``locked``: a uv.lock already chose torch's build."""
    if facts.get("implementation") != "cpython":
        raise TargetError(f"its Python is {facts.get('implementation')}; environments are made for CPython")
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(facts["machine"].lower(), facts["machine"].lower())
    if machine not in ("x86_64", "aarch64"):
        raise TargetError(f"its machine is {facts['machine']}; environments are made for x86_64 and aarch64")
    glibc = facts.get("glibc")
    if glibc:
        minor = int(glibc.split(".")[1]) if glibc.count(".") >= 1 and glibc.split(".")[1].isdigit() else 17
        chosen = max((m for m in _GLIBC if m <= minor), default=None)
        if chosen is None:
            raise TargetError(f"its glibc is {glibc}; wheels need 2.17 or newer")
        platform = f"{machine}-manylinux_2_{chosen}"
    else:
        platform = f"{machine}-unknown-linux-musl"
    python = ".".join(facts["python"].split(".")[:2])
    return Target(python, platform, _torch_backend(torch_backend, facts.get("cuda_driver"), locked))


def _torch_backend(setting: str, driver: Optional[int], locked: bool) -> Optional[str]:
    if setting == "none" or (setting == "auto" and locked):
        return None
    if setting != "auto":
        return setting
    if not driver:
        return "cpu"
    return next((name for needed, name in _TORCH_CUDA if driver >= needed), "cpu")


def cache_dir() -> Path:
    """This machine's resolutions and wheels: ``$FSDPCTL_CACHE_DIR``, else ``$XDG_CACHE_HOME/fsdpctl``."""
    explicit = os.environ.get("FSDPCTL_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "fsdpctl"


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def resolve(plan: EnvPlan, target: Target) -> tuple[Wheel, ...]:
    """The environment's wheels for ``target``, from the cache when its inputs have not changed; nodes of
    one platform asking at once resolve once. Raises uv.ResolveError."""
    inputs = {"files": dict(plan.files), "index_url": plan.index_url, "extra": list(plan.extra_index_urls),
              "find_links": list(plan.find_links), "target": [target.python, target.platform, target.torch_backend],
              "uv": uv.uv_version()}
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_dir() / "resolutions" / f"{key}.pylock.toml"
    with _lock_for(key):
        if not path.exists():
            with tempfile.TemporaryDirectory(prefix="fsdpctl-resolve-") as folder:
                requirements = _input_file(plan, Path(folder))
                out = Path(folder) / "pylock.toml"
                uv.compile_pylock(requirements, out, python_version=target.python, python_platform=target.platform,
                                  torch_backend=target.torch_backend, index_url=plan.index_url,
                                  extra_index_urls=plan.extra_index_urls, find_links=plan.find_links)
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(f".{os.getpid()}.part")
                partial.write_bytes(out.read_bytes())
                partial.replace(path)
    return wheels_of(path.read_text(encoding="utf-8"))


def _input_file(plan: EnvPlan, folder: Path) -> Path:
    """What uv resolves: the requirement lines, a lock's packages, or a project's dependencies."""
    requirements = folder / "requirements.txt"
    if "requirements.txt" in plan.files:
        requirements.write_text(plan.files["requirements.txt"], encoding="utf-8")
        return requirements
    project = folder / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(plan.files["pyproject.toml"], encoding="utf-8")
    if "uv.lock" not in plan.files:
        return project / "pyproject.toml"
    (project / "uv.lock").write_text(plan.files["uv.lock"], encoding="utf-8")
    requirements.write_text(uv.export_lock(project), encoding="utf-8")
    return requirements


def python_refused(plan: EnvPlan, version: str) -> Optional[str]:
    """The project's ``requires-python`` when the node's Python ``version`` is outside it."""
    if "pyproject.toml" not in plan.files:
        return None
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    wanted = tomllib.loads(plan.files["pyproject.toml"]).get("project", {}).get("requires-python")
    try:
        return wanted if wanted and version not in SpecifierSet(wanted) else None
    except InvalidSpecifier:
        return None


def wheels_of(pylock: str) -> tuple[Wheel, ...]:
    """A pylock.toml's packages as wheels; one that has only a source archive is refused by name."""
    found = []
    for package in tomllib.loads(pylock).get("packages", []):
        wheels = package.get("wheels") or []
        if not wheels:
            raise uv.ResolveError(f"{package['name']} {package.get('version', '')} has no wheel for this platform, "
                                  f"only a source archive; nodes install wheels only: build one (uv build --wheel) "
                                  f"and add its folder to environment.find_links")
        wheel = wheels[0]
        url = wheel.get("url") or wheel.get("path", "")
        file = wheel.get("name") or url.rsplit("/", 1)[-1]
        found.append(Wheel(package["name"], str(package.get("version", "")), unquote(file), url,
                           wheel["hashes"]["sha256"], wheel.get("size")))
    return tuple(found)


def env_key(wheels: tuple[Wheel, ...], facts: dict[str, Any]) -> str:
    """The name of a node's environment: its wheels exactly, and the interpreter it is made from."""
    body = json.dumps({"wheels": sorted(w.sha256 for w in wheels), "python": facts["python"],
                       "base": facts["executable"]}, sort_keys=True)
    return "k" + hashlib.sha256(body.encode()).hexdigest()[:16]
