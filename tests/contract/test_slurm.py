"""The contract, held to the ``slurm`` backend: a real Slurm cluster (slurmctld, a slurmd on n1 and n2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.contract.contract import Cluster, Contract

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(lab, slurm, tmp_path: Path) -> Cluster:
    profile = tmp_path / "slurmlab.yaml"
    profile.write_text(f"name: slurmlab\nbackend: slurm\ndevice: cpu\nnproc_per_node: 1\npython: {sys.executable}\n"
                       f"workdir: {tmp_path}/work\nnetwork:\n  interface: eth0\nslurm:\n  nodes: 2\n  time: \"10\"\n")

    def in_client(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run(lab.in_client(argv), env={**env, **slurm.env}, cwd=cwd, capture_output=True,
                              text=True, timeout=300)

    return Cluster("slurm", profile, world=2, hosts=["n1", "n2"], runner=in_client, queued=True)


class TestSlurmBackend(Contract):
    pass
