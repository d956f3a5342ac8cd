"""doctor --collectives on the local profile: a real 2-process gloo all-reduce/all-gather run."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.workload


def test_local_collectives_report_bus_bandwidth(tmp_path):
    result = run_cli("doctor", "-p", "local", "--collectives", "--json", cwd=tmp_path,
                     env={"FSDPCTL_RUNS_DIR": str(tmp_path / "runs")}, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(result.stdout)["collectives"]
    assert data["backend"] == "gloo" and data["world_size"] == 2 and data["transport"] == ["gloo/TCP"]
    ops = {(row["op"], row["bytes"]) for row in data["results"]}
    assert ("all_reduce", 1 << 20) in ops and ("all_gather", 1 << 20) in ops
    assert all(row["busbw_gbps"] > 0 and row["seconds"] > 0 for row in data["results"])
    assert (tmp_path / "runs" / data["run_id"] / "run.json").exists()  # launched like any run
