"""uv on the launching machine: the one module that runs it (the registry package ``uv``, its binary).

It resolves an environment for a node's platform (``uv pip compile --format pylock.toml``: exactly one
wheel per package, with its URL and sha256), and turns a ``uv.lock`` into requirement lines.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ..errors import UsageError

RESOLVE_TIMEOUT = 600.0


class ResolveError(Exception):
    """uv could not resolve: its own words, on one line."""


@functools.lru_cache(maxsize=1)
def uv_binary() -> str:
    """The uv that came with fsdpctl (the ``uv`` package), else one on PATH."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        import shutil

        found = shutil.which("uv")
        if found:
            return found
    raise UsageError("environment: uv is not installed where fsdpctl runs", "pip install uv (or reinstall fsdpctl)")


@functools.lru_cache(maxsize=1)
def uv_version() -> str:
    """``0.13.9``: the version a node is given too, when it has none."""
    return _run([uv_binary(), "--version"], 60).split()[1]


def _run(argv: Sequence[str], timeout: float, cwd: Path | None = None) -> str:
    env = {**os.environ, "UV_NO_PROGRESS": "1"}
    env.pop("VIRTUAL_ENV", None)  # uv would otherwise read this process's venv as the target
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired:
        raise ResolveError(f"uv took over {timeout:.0f} s") from None
    if done.returncode != 0:
        raise ResolveError(one_line(done.stderr or done.stdout) or f"uv exited {done.returncode}")
    return done.stdout


def one_line(text: str) -> str:
    """uv's message without its tree drawing, on one line."""
    words = []
    for line in text.splitlines():
        line = line.strip().lstrip("×╰─▶│├ ").strip()
        if line and not line.startswith(("hint:", "Using ", "Resolved ")):
            words.append(line)
    return " ".join(" ".join(words).split())


def compile_pylock(requirements: Path, output: Path, *, python_version: str, python_platform: str,
                   torch_backend: str | None, index_url: str | None, extra_index_urls: Sequence[str],
                   find_links: Sequence[str]) -> None:
    """Resolve ``requirements`` for one platform into ``output`` (a pylock.toml)."""
    argv = [uv_binary(), "pip", "compile", "--quiet", "--no-header", "--no-config", "--format", "pylock.toml",
            "--python-version", python_version, "--python-platform", python_platform,
            "-o", str(output), str(requirements)]
    if torch_backend:
        argv += ["--torch-backend", torch_backend]
    if index_url:
        argv += ["--index-url", index_url]
    for url in extra_index_urls:
        argv += ["--extra-index-url", url]
    for link in find_links:
        argv += ["--find-links", link]
    _run(argv, RESOLVE_TIMEOUT, cwd=requirements.parent)


def export_lock(project: Path) -> str:
    """A ``uv.lock``'s packages as requirement lines (``uv export --frozen``), the project itself left out."""
    return _run([uv_binary(), "export", "--frozen", "--no-header", "--no-hashes", "--no-emit-project",
                 "--format", "requirements-txt", "--no-config"], RESOLVE_TIMEOUT, cwd=project)
