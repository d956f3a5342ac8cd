"""The contract suite's fixtures: the fake backend registered through its entry point (as an installed
package would register it), and the namespace lab of the integration tests for the SSH and Slurm backends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import lab, slurm  # noqa: F401 - the same testbed fixtures, shared

FAKE_ENTRY_POINT = "fake = tests.fakebackend:FakeBackend"


def register_fake(folder: Path) -> Path:
    """A distribution's metadata in ``folder`` that registers the fake backend under the entry point
    group fsdpctl.backends: what ``pip install`` of a backend's package leaves in site-packages."""
    info = folder / "fsdpctl_fake_backend-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fsdpctl-fake-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[fsdpctl.backends]\n{FAKE_ENTRY_POINT}\n")
    return folder


@pytest.fixture(scope="session")
def fake_installed(tmp_path_factory) -> Path:
    """The folder holding the fake backend's registration, on this process's path (and for the
    processes the tests start, on their PYTHONPATH)."""
    from fsdpctl.backends import refresh

    folder = register_fake(tmp_path_factory.mktemp("site"))
    sys.path.insert(0, str(folder))
    refresh()
    yield folder
    sys.path.remove(str(folder))
    refresh()


def run_here(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
