"""The contract, held to the fake backend: a package outside fsdpctl, found through its entry point."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.contract.conftest import run_here
from tests.contract.contract import Cluster, Contract

FAKE_PROFILE = "name: fake\nbackend: fake\nhosts: [f1, f2]\nnproc_per_node: 1\ndevice: cpu\nworkdir: {workdir}\n"


@pytest.fixture
def cluster(fake_installed: Path, tmp_path: Path) -> Cluster:
    profile = tmp_path / "fake.yaml"
    profile.write_text(FAKE_PROFILE.format(workdir=tmp_path / "work"))
    return Cluster("fake", profile, world=2, hosts=["f1", "f2"], runner=run_here,
                   env={"PYTHONPATH": str(fake_installed)})


class TestFakeBackend(Contract):
    pass


def test_a_backend_is_one_package_plus_its_entry_point(fake_installed: Path, tmp_path: Path):
    """Without its entry point, a profile naming the fake backend is refused in one line that says how
    backends are found; with it (nothing else changed), fsdpctl lists and runs it."""
    profile = tmp_path / "fake.yaml"
    profile.write_text(FAKE_PROFILE.format(workdir=tmp_path / "work"))
    (tmp_path / "x.py").write_text("print('x')\n")
    plain = {"PYTHONPATH": str(REPO), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs")}
    refused = run_cli("launch", "-p", str(profile), "--dry-run", "--", "x.py", env=plain, cwd=tmp_path)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert (f"{profile.name}:2: backend: 'fake' is not a backend fsdpctl knows" in refused.stderr
            and "entry point group fsdpctl.backends" in refused.stderr), refused.stderr
    installed = {**plain, "PYTHONPATH": os.pathsep.join([str(REPO), str(fake_installed)])}
    shown = run_cli("launch", "-p", str(profile), "--dry-run", "--code", str(tmp_path), "--", "x.py",
                    env=installed, cwd=tmp_path)
    assert shown.returncode == 0 and "# backend fake, 2 node(s)" in shown.stdout, shown.stderr
