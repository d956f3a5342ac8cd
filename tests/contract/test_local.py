"""The contract, held to the ``local`` backend: this machine, real torchrun, two ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.contract.conftest import run_here
from tests.contract.contract import Cluster, Contract


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    profile = tmp_path / "mine.yaml"
    profile.write_text(f"name: mine\nbackend: local\nnproc_per_node: 2\ndevice: cpu\npython: {sys.executable}\n"
                       f"workdir: {tmp_path}/work\n")
    return Cluster("local", profile, world=2, hosts=["localhost"], runner=run_here)


class TestLocalBackend(Contract):
    pass
