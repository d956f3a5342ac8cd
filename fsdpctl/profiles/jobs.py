"""Job files: ``--job NAME`` looks in ``./jobs/NAME.yaml``, then ``$XDG_CONFIG_HOME/fsdpctl/jobs/``;
``--job path/to/file.yaml`` reads that file. Read as strictly as profiles (unknown keys, types and
ranges are one-line errors naming the file, line and field)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ProfileNotFound
from .loader import display_path, looks_like_path, parse_document, read_text
from .schema import NAME_PATTERN, JobSpec


@dataclass(frozen=True)
class LoadedJob:
    """A validated job file and where it came from (its relative paths are relative to its folder)."""

    job: JobSpec
    path: Path

    def resolve(self, relative: str) -> Path:
        """A path the job file names, as seen from here."""
        return (self.path.parent / relative).expanduser()


def job_search_path(cwd: Path | None = None, env: dict[str, str] | None = None) -> list[Path]:
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    config_home = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config")
    return [cwd / "jobs", config_home / "fsdpctl" / "jobs"]


def find_job(name: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Path:
    """``--job`` value -> the job file."""
    if looks_like_path(name):
        return Path(name).expanduser()
    if not NAME_PATTERN.match(name):
        raise ProfileNotFound(f"--job {name!r}: not a job name", "give a name in ./jobs or a path to a .yaml file")
    folders = job_search_path(cwd, env)
    for folder in folders:
        for suffix in (".yaml", ".yml"):
            if (folder / f"{name}{suffix}").is_file():
                return folder / f"{name}{suffix}"
    raise ProfileNotFound(f"--job {name}: no such job", "looked in " + ", ".join(str(f) for f in folders))


def load_job(name: str) -> LoadedJob:
    """Read and validate a job file."""
    path = find_job(name)
    text = read_text(path, "job", "put it in ./jobs/")
    return LoadedJob(parse_document(text, display_path(path), JobSpec, "job"), path)
