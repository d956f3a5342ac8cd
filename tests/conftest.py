"""Shared test helpers: where the repository is, and how to run the CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m fsdpctl ARGS`` in a subprocess, as a user's shell would."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("FSDPCTL_DEBUG", None) if env is None or "FSDPCTL_DEBUG" not in env else None
    return subprocess.run([sys.executable, "-m", "fsdpctl", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """A HOME and XDG_CONFIG_HOME of the test's own, so user profiles on the machine never leak in."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    return home


@pytest.fixture(autouse=True)
def own_state_dir(tmp_path, monkeypatch):
    """fsdpctl's state on this machine (hosts excluded per profile) is each test's own: an exclusion one
    test makes never reaches another, nor the machine's real state."""
    monkeypatch.setenv("FSDPCTL_STATE_DIR", str(tmp_path / "fsdpctl-state"))
