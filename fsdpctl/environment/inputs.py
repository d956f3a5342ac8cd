"""An ``environment`` section read into an EnvPlan: the files it names, read here once (a lock or a
requirements file), their contents carried by the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import UsageError
from ..plan.environment import EnvPlan
from ..profiles.environment_spec import EnvironmentSpec


def env_plan_of(spec: EnvironmentSpec, base: Path, where: str) -> EnvPlan:
    """``spec`` with its ``file`` (relative to ``base``) read. ``where`` names the section in messages
    (``cluster_profiles/lab.yaml: environment``, ``--env-from``)."""
    files: dict[str, str] = {}
    source = "packages"
    if spec.file:
        path = (base / spec.file).expanduser()
        source = path.name
        files = _read(path, where)
    if spec.packages:
        from packaging.requirements import InvalidRequirement, Requirement

        for line in spec.packages:
            try:
                Requirement(line)
            except InvalidRequirement:
                raise UsageError(f"{where}.packages: {line!r} is not a requirement",
                                 "write name and version, e.g. numpy==2.1.3") from None
        if "pyproject.toml" in files:
            raise UsageError(f"{where}: packages beside a project's {source}",
                             "add them to the project (uv add NAME), or list them in a requirements.txt")
        lines = files.get("requirements.txt", "")
        files["requirements.txt"] = lines + ("\n" if lines and not lines.endswith("\n") else "") + \
            "\n".join(spec.packages) + "\n"
        source = f"{source} and packages" if spec.file else source
    if not files:
        raise UsageError(f"{where}: names neither file nor packages", "give file: uv.lock (or requirements.txt), "
                                                                     "or packages: [numpy==2.1.3]")
    return EnvPlan(files=files, source=source, index_url=spec.index_url, extra_index_urls=spec.extra_index_urls,
                   find_links=tuple(_link(base, link) for link in spec.find_links), torch_backend=spec.torch_backend,
                   install=spec.install, keep=spec.keep, root=spec.root or "")


def _link(base: Path, link: str) -> str:
    """A find_links folder made absolute (uv runs elsewhere); a URL as it is."""
    if "://" in link:
        return link
    return str((base / link).expanduser().resolve())


def _read(path: Path, where: str) -> dict[str, str]:
    """The files a path stands for: a uv.lock with its pyproject.toml, a pyproject.toml (with its
    uv.lock when one lies beside it), or a requirements file (``-r`` followed)."""
    if not path.exists():
        raise UsageError(f"{where}.file: {path} does not exist", "give a uv.lock, pyproject.toml or requirements.txt")
    if path.name == "uv.lock" or path.name == "pyproject.toml":
        project = path.parent / "pyproject.toml"
        lock = path.parent / "uv.lock"
        if not project.exists():
            raise UsageError(f"{where}.file: {path} has no pyproject.toml beside it", "give the project's uv.lock")
        files = {"pyproject.toml": project.read_text(encoding="utf-8")}
        if lock.exists():
            files["uv.lock"] = lock.read_text(encoding="utf-8")
        return files
    return {"requirements.txt": _requirement_text(path, where, set())}


def _requirement_text(path: Path, where: str, seen: set[Path]) -> str:
    """A requirements file's lines, ``-r`` files inlined (the nodes never see the files themselves)."""
    if path.resolve() in seen:
        return ""
    seen.add(path.resolve())
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"{where}.file: {path} cannot be read ({exc.strerror})", "give a readable file") from None
    out: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(("-r ", "--requirement ")):
            out.append(_requirement_text(path.parent / stripped.split(None, 1)[1], where, seen))
        elif stripped.startswith(("-e ", "--editable")):
            raise UsageError(f"{where}.file: {path}: {stripped!r} is an editable install",
                             "nodes install wheels: your own code travels with the run (code:), not in the environment")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def spec_from_flag(path: Optional[Path], spec: Optional[EnvironmentSpec]) -> Optional[EnvironmentSpec]:
    """``--env-from FILE`` over the profile's section (its index and install settings kept)."""
    if path is None:
        return spec
    import dataclasses

    base = spec or EnvironmentSpec()
    return dataclasses.replace(base, file=str(path.expanduser().resolve()), packages=())
