"""Under torch.compile a program runs under fsdpctl as it runs under torchrun: the start-up hook's
wrappers pass through while dynamo traces, dynamo's tables keep the originals, and a wrapper of the
program's own stays. The same script is launched both ways and its outputs compared (dynamo's graph
and graph-break counts among them); a compiled training step is counted by dynamo alike with the
telemetry off and on, and what the telemetry cannot see of it is said."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.workload.conftest import VENV_BIN, free_port

pytestmark = pytest.mark.workload

SCRIPT = REPO / "tests" / "user_scripts" / "compiled_collective.py"
SAID = re.compile(r"^(?:\[localhost r\d\] )?(rank \d .*)$", re.MULTILINE)


def said(out: str) -> list[str]:
    """The script's own lines, whichever launcher prefixed them, in one order."""
    return sorted(SAID.findall(out))


def test_a_fullgraph_compiled_collective_and_a_programs_own_wrapper_run_as_under_torchrun(tmp_path):
    code = tmp_path / "project"
    code.mkdir()
    shutil.copy(SCRIPT, code / SCRIPT.name)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FSDPCTL_RUNS_DIR": str(tmp_path / "runs")}
    plain = subprocess.run([str(VENV_BIN / "torchrun"), "--nproc-per-node=2", "--master-addr=127.0.0.1",
                            f"--master-port={free_port()}", SCRIPT.name], cwd=code, env=env, capture_output=True,
                           text=True, timeout=600)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    ours = subprocess.run([str(VENV_BIN / "fsdpctl"), "launch", "-p", "local", "--code", str(code), "--",
                           SCRIPT.name], cwd=code, env=env, capture_output=True, text=True, timeout=600)
    assert ours.returncode == 0, ours.stdout[-3000:] + ours.stderr[-3000:]
    expected = said(plain.stdout)
    assert len(expected) == 2 * 9, plain.stdout  # both ranks: names, own wrapper, 6 steps, dynamo's counts
    assert "rank 0 own wrapper: 1 call(s), still in place: True" in expected
    assert "rank 0 names are one function: True" in expected
    assert said(ours.stdout + ours.stderr) == expected  # losses, means and graph / break counts alike

    run_id = re.search(r"run (\S+) succeeded", ours.stdout + ours.stderr).group(1)
    copy = tmp_path / "runs" / run_id / "live" / "node0" / "telemetry" / "node0.jsonl"  # the collector's
    rows = [json.loads(line) for line in copy.read_text().splitlines()]
    steps = [r for r in rows if r.get("source") == "hook"]
    assert {r["rank"] for r in steps} == {0, 1} and sum(r["steps"] for r in steps) == 12  # 6 steps, 2 ranks
    # the compiled all-reduce of each step ran where no wrapper times it: counted, and said not timed
    assert all(r.get("untimed_ops") == 1.0 for r in steps if r["step"] > 1), steps


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
print(json.dumps({"breaks": dict(counters["graph_break"]), "graphs": counters["stats"]["unique_graphs"]}))
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


def test_a_compiled_training_step_is_traced_alike_and_its_unseen_steps_are_said(tmp_path):
    plain, none = compiled(tmp_path, "0")
    timed, rows = compiled(tmp_path, "1")
    assert not none
    assert timed == plain and plain["graphs"] >= 1  # the same graphs, the same breaks, each for the same reason
    # its optimizer step runs compiled, where the hook passes through: no step is counted, and the rank says why
    assert [r for r in rows if r.get("source") == "hook"] == []
    said = {r["fsdpctl_event"]: r for r in rows}  # and, as the program leaves, its exit with no step seen
    assert sorted(said) == ["program_exit", "steps_unseen"] and len(rows) == 2, rows
    unseen, left = said["steps_unseen"], said["program_exit"]
    assert unseen["backward"] == 6 and unseen["rank"] == 0
    assert left["steps"] == 0 and left["last_step_at"] is None
