"""Under torch.compile the rank telemetry's wrappers add no graph break: a compiled training step
(FSDP2, backward and the optimizer step inside it) counted by dynamo with the telemetry off and on."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.workload

PROGRAM = """\
import json, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
mesh = init_device_mesh("cpu", (1,))
fully_shard(model[0], mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

@torch.compile
def step(x):
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss

for _ in range(6):
    step(torch.randn(8, 16))
from torch._dynamo.utils import counters
print(json.dumps({"breaks": sum(counters["graph_break"].values()), "graphs": counters["stats"]["unique_graphs"]}))
dist.destroy_process_group()
"""


def compiled(tmp_path, telemetry: str) -> tuple[dict, list[dict]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run_dir = tmp_path / f"run{telemetry}"
    run_dir.mkdir()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "FSDPCTL_RUN_DIR": str(run_dir), "FSDPCTL_TELEMETRY": telemetry,
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "fsdpctl" / "node" / "startup"),
                                                                   str(REPO)])}
    env.pop("FSDPCTL_RANK_HOOK_PID", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    path = run_dir / "telemetry" / "node0.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return json.loads(done.stdout.splitlines()[-1]), rows


def test_the_wrappers_add_no_graph_break_and_still_count_a_compiled_step(tmp_path):
    plain, none = compiled(tmp_path, "0")
    timed, rows = compiled(tmp_path, "1")
    assert not none
    assert timed["breaks"] <= plain["breaks"] and timed["graphs"] <= plain["graphs"], (plain, timed)
    assert sum(r["steps"] for r in rows) == 6 and all(r["backward_per_step"] == 1.0 for r in rows)
