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


SECONDS_PER_TEST = {"integration": 40.0, "workload": 15.0}
"""A test's rough cost by its marker (what a CI run took, on average); any other test costs a fraction of a second."""


def pytest_collection_modifyitems(config, items):
    """The costliest modules first, so that two workers end together: pytest-xdist's loadscope hands
    modules out in this order (with --no-loadscope-reorder, as dev.sh passes it); by default it hands
    out the modules with the most tests first, which left the slow integration modules of a few tests
    each to the end, run by one worker while the other had nothing left."""
    cost: dict[str, float] = {}
    for item in items:
        marked = [SECONDS_PER_TEST[m.name] for m in item.iter_markers() if m.name in SECONDS_PER_TEST]
        cost[item.module.__name__] = cost.get(item.module.__name__, 0.0) + max(marked, default=0.2)
    items.sort(key=lambda item: -cost[item.module.__name__])  # stable: a module's own order stays
