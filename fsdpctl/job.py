"""The user's job as one value: their command, the code that goes with it, its environment and
requirements, from a job file (``--job``) and the command line (flags win over the file).

Without a command the bundled workload runs, and none of this applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .bundle import DEFAULT_CODE_LIMIT_MB, CodeManifest, collect_code
from .errors import UsageError
from .profiles.schema import env_name_problem, looks_like_credential


@dataclass(frozen=True)
class JobFlags:
    """What the command line says of the job (None / empty: not given)."""

    command: tuple[str, ...] = ()
    job: Optional[str] = None
    code: Optional[Path] = None
    no_code: bool = False
    chdir: Optional[str] = None
    code_limit_mb: Optional[int] = None
    env: tuple[str, ...] = ()
    """``--env`` items: ``NAME=VALUE``, or a bare ``NAME``, a secret taken from the environment."""
    requirements_file: Optional[Path] = None


@dataclass(frozen=True)
class Job:
    """The resolved job."""

    command: tuple[str, ...] = ()
    profile: Optional[str] = None
    code: Optional[CodeManifest] = None
    chdir: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    """Names of variables whose values come from the launcher's environment."""
    requirements: tuple[str, ...] = ()
    nproc_per_node: Optional[int] = None
    nodes: Optional[int] = None
    time: Optional[str] = None
    fetch: tuple[str, ...] = ()


def parse_env_items(items: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
    """``--env`` items, checked like a profile's ``env``: (variables with their values, secret names).
    ``NAME=VALUE`` is written into the run's scripts; a bare ``NAME`` is a secret, its value taken
    from this environment at launch and written nowhere (as ``docker run -e NAME``)."""
    env: dict[str, str] = {}
    secrets: list[str] = []
    for item in items:
        name, sep, value = item.partition("=")
        if problem := env_name_problem(name):
            raise UsageError(f"--env {name}: {problem[0]}", problem[1])
        if not sep:
            secrets.append(name)
            continue
        if "\0" in value:
            raise UsageError(f"--env {name}: the value contains a NUL byte", "remove it")
        env[name] = value
    return env, tuple(secrets)


def secret_values(names: tuple[str, ...], environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The secrets' values from the environment fsdpctl runs in; a missing one is a usage error."""
    import os

    environ = os.environ if environ is None else environ
    for name in names:
        if name not in environ:
            raise UsageError(f"secret {name}: not set in the environment fsdpctl runs in",
                             f"export {name}=... in this shell (its value is passed to the ranks and written "
                             f"nowhere), or drop it from --env / secrets:")
    return {name: environ[name] for name in names}


def credential_like(env: dict[str, str]) -> list[str]:
    """Plain variables whose names say credential: they would be written into the run's files."""
    return [name for name in env if looks_like_credential(name)]


def resolve_job(flags: JobFlags, cwd: Path) -> Job:
    """Combine the job file (when ``--job`` is given) with the flags; collect the code to copy."""
    from .doctor.requirements import read_requirements
    from .profiles.jobs import load_job

    loaded = load_job(flags.job) if flags.job else None
    spec = loaded.job if loaded else None
    command = flags.command or (spec.command if spec else ())
    if flags.no_code and flags.code is not None:
        raise UsageError("--code and --no-code: give one of them", "--no-code runs the code where it already is")
    if not command:
        misplaced = [name for given, name in ((flags.code is not None, "--code"), (flags.no_code, "--no-code"),
                                              (flags.chdir is not None, "--chdir")) if given]
        if misplaced:
            raise UsageError(f"{misplaced[0]}: goes with a command of your own; the bundled workload ships itself",
                             "add your program after --, e.g. -- train.py --epochs 3")
        requirements = read_requirements(flags.requirements_file) if flags.requirements_file else ()
        env, secrets = parse_env_items(flags.env)
        return Job(env=env, secrets=secrets, requirements=requirements)
    limit = (flags.code_limit_mb or (spec.code_limit_mb if spec else DEFAULT_CODE_LIMIT_MB)) * 1_000_000
    if flags.code is not None:
        code_dir: Optional[Path] = flags.code
    elif flags.no_code or (spec is not None and spec.code is None):
        code_dir = None
    else:
        code_dir = loaded.resolve(spec.code) if loaded and spec and spec.code else cwd
    chdir = flags.chdir or (spec.chdir if spec else None)
    if code_dir is not None and flags.chdir is not None:
        raise UsageError("--chdir: goes with --no-code (with code copied, the ranks start in its copy)",
                         "add --no-code, or drop --chdir")
    if code_dir is None and chdir is None:
        chdir = str(cwd)  # runs in place: this folder, at the same path on every node
    env = dict(spec.env) if spec else {}
    flag_env, flag_secrets = parse_env_items(flags.env)
    env.update(flag_env)
    secrets = tuple(dict.fromkeys((*(spec.secrets if spec else ()), *flag_secrets)))
    requirements = tuple(spec.requirements) if spec else ()
    if loaded and spec and spec.requirements_file:
        requirements += read_requirements(loaded.resolve(spec.requirements_file))
    if flags.requirements_file:
        requirements += read_requirements(flags.requirements_file)
    return Job(command=tuple(command), profile=spec.profile if spec else None,
               code=collect_code(code_dir, limit) if code_dir is not None else None, chdir=chdir, env=env,
               secrets=secrets, requirements=requirements, nproc_per_node=spec.nproc_per_node if spec else None,
               nodes=spec.nodes if spec else None, time=spec.time if spec else None,
               fetch=spec.fetch if spec else ())
