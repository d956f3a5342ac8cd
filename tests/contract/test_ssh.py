"""The contract, held to the ``ssh`` backend: two hosts of the namespace lab, each with its sshd."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.contract.contract import Cluster, Contract

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(lab, tmp_path: Path) -> Cluster:
    profile = tmp_path / "lab.yaml"
    profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable))

    def in_client(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run(lab.in_client(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=300)

    return Cluster("ssh", profile, world=2, hosts=[lab.hosts["n1"].address, lab.hosts["n2"].address],
                   runner=in_client)


class TestSSHBackend(Contract):
    pass
