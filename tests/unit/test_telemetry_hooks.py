"""The rank telemetry on a real torch, in a rank started as torchrun starts one (its environment, the
start-up hook first on the path): what a program's steps leave in its node's rows, and a fault of
the telemetry's own that leaves the program as it was."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpctl.node.telemetry.patches import batch_tokens
from tests.conftest import REPO

torch = pytest.importorskip("torch")

PROGRAM = """\
import sys
import torch, torch.distributed as dist
from torch.utils.data import DataLoader

if sys.argv[1] == "break":  # a fault in fsdpctl's own code, as a bug would be
    import fsdpctl.node.telemetry.steps as steps
    def broken(self, loss):
        raise RuntimeError("a bug of fsdpctl's")
    steps.StepTracker.backward_called = broken

class Both(torch.optim.Optimizer):  # an optimizer container: its step calls two inner steps
    def __init__(self, first, second):
        self.inner = [first, second]
        super().__init__([p for o in self.inner for g in o.param_groups for p in g["params"]], {})
    def step(self, closure=None):
        for o in self.inner:
            o.step()

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 6, 1))
optimizer = Both(torch.optim.SGD(model[:1].parameters(), lr=0.1), torch.optim.SGD(model[2].parameters(), lr=0.1))
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
batches = [{"input_ids": torch.randint(0, 50, (4, 6)), "y": torch.randn(4, 1)} for _ in range(12)]
loader = iter(DataLoader(batches, batch_size=None, num_workers=1))  # a worker process: nothing of it counted
for step in range(1, 7):
    total = 0.0
    for micro in range(2):
        batch = next(loader)
        loss = (model(batch["input_ids"]) - batch["y"]).square().mean() / 2
        if micro:
            torch.autograd.backward([scaler.scale(loss)])
        else:
            scaler.scale(loss).backward()
        total += loss.item()
    dist.all_reduce(torch.ones(3))
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(f"step {step} loss {total:.6f}", flush=True)
print("backward is torch's own:", not hasattr(torch.Tensor.backward, "__wrapped__"), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_rank(tmp_path: Path, mode: str, telemetry: str = "1") -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / f"run-{mode}-{telemetry}"
    run_dir.mkdir()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "FSDPCTL_RUN_DIR": str(run_dir), "FSDPCTL_TELEMETRY": telemetry,
           "FSDPCTL_NODE_RANK": "0", "FSDPCTL_HOST": "here", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "fsdpctl" / "node" / "startup"), str(REPO)])}
    env.pop("FSDPCTL_RANK_HOOK_PID", None)
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], env=env, capture_output=True, text=True, timeout=120)
    return done, run_dir / "telemetry" / "node0.jsonl"


def printed_losses(out: str) -> list[float]:
    return [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step ")]


def test_a_programs_steps_loss_tokens_and_collectives_reach_its_rows(tmp_path):
    done, rows_file = run_rank(tmp_path, "plain")
    assert done.returncode == 0, done.stderr
    assert "backward is torch's own: False" in done.stdout  # wrapped while the program ran
    lines = [json.loads(line) for line in rows_file.read_text().splitlines()]
    rows = [r for r in lines if "fsdpctl_event" not in r]
    assert sum(r["steps"] for r in rows) == 6 and rows[-1]["step"] == 6  # the container's 3 calls: one step
    exited = [r for r in lines if r.get("fsdpctl_event") == "program_exit"]
    assert len(exited) == 1 and exited[0]["steps"] == 6 and exited[0]["last_step_at"] <= exited[0]["time"]
    assert all(r["backward_per_step"] == 2.0 for r in rows)  # two micro-batches, through both backward forms
    losses = printed_losses(done.stdout)
    by_step = {r["step"]: r for r in rows}
    compared = 0
    for step, printed in enumerate(losses, 1):
        if step in by_step and by_step[step]["steps"] == 1:  # the scaler's x1024 undone
            assert abs(by_step[step]["loss"] - printed) < 1e-4 * max(1.0, abs(printed)), (step, by_step[step], printed)
            compared += 1
    assert compared >= 2, rows  # (the first windows hold a step each: step 1, then step 2)
    assert all(r["tokens"] == "estimated" and r["tokens_per_s"] > 0 for r in rows)  # input_ids: 4 x 6 per batch
    assert all(r["comm"] == "waited" and r["comm_s"] > 0 and r["compute_s"] >= 0 for r in rows)
    assert rows[0]["host"] == "here" and rows[0]["node"] == 0 and rows[0]["mem_mb"] > 50


def test_a_fault_of_the_telemetrys_own_leaves_the_program_as_it_was(tmp_path):
    without, _ = run_rank(tmp_path, "plain", telemetry="0")
    broken, rows_file = run_rank(tmp_path, "break")
    assert broken.returncode == without.returncode == 0, broken.stderr
    assert printed_losses(broken.stdout) == printed_losses(without.stdout) and len(printed_losses(without.stdout)) == 6
    said = [line for line in broken.stderr.splitlines() if "rank telemetry is off" in line]
    assert len(said) == 1 and "a bug of fsdpctl's" in said[0]
    assert "backward is torch's own: True" in broken.stdout  # every wrapper taken off again
    assert not rows_file.exists() or not rows_file.read_text().strip()


def test_tokens_are_counted_only_where_a_batch_shows_them():
    ids = torch.zeros(4, 16, dtype=torch.long)
    assert batch_tokens(ids) == 64 and batch_tokens((ids, torch.zeros(4))) == 64
    assert batch_tokens({"input_ids": ids, "labels": ids}) == 64
    assert batch_tokens(torch.zeros(4, 16)) == 0  # floating point: not tokens
    assert batch_tokens(torch.zeros(4, 16, 3, dtype=torch.long)) == 0 and batch_tokens({"pixels": ids}) == 0
    assert batch_tokens([]) == 0 and batch_tokens(None) == 0 and batch_tokens(torch.zeros(4, 16, dtype=torch.bool)) == 0


FAULT = """\
import functools, sys
import torch, torch.distributed as dist

if sys.argv[1] == "break":  # a fault in fsdpctl's own code inside a collective, as a bug would be
    import fsdpctl.node.telemetry.steps as steps
    def broken(self, seconds, operations=0):
        raise RuntimeError("a bug of fsdpctl's")
    steps.StepTracker.comm = broken

dist.init_process_group("gloo")
calls, before = [], dist.all_reduce
@functools.wraps(before)
def counting(*args, **kwargs):  # the program's own wrapper, set before anything goes wrong
    calls.append(1)
    return before(*args, **kwargs)
dist.all_reduce = counting
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.ones(2, 4)).sum().backward()
    dist.all_reduce(torch.ones(1))
    optimizer.step()
    optimizer.zero_grad()
try:
    dist.broadcast(torch.ones(1), src=7)  # a collective that fails by itself: the program handles its error
except Exception as exc:
    print("caught", type(exc).__name__, str(exc).splitlines()[0], flush=True)
print("own wrapper", len(calls), dist.all_reduce is counting, flush=True)
dist.destroy_process_group()
"""


def run_program(tmp_path: Path, program: str, mode: str, telemetry: str) -> subprocess.CompletedProcess:
    run_dir = tmp_path / f"run-{mode}-{telemetry}"
    run_dir.mkdir()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "FSDPCTL_RUN_DIR": str(run_dir), "FSDPCTL_TELEMETRY": telemetry,
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO / "fsdpctl" / "node" / "startup"),
                                                                   str(REPO)])}
    env.pop("FSDPCTL_RANK_HOOK_PID", None)
    return subprocess.run([sys.executable, "-c", program, mode], env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_fault_of_fsdpctls_inside_a_collective_never_replaces_its_error_nor_the_programs_wrapper(tmp_path):
    without = run_program(tmp_path, FAULT, "plain", "0")
    broken = run_program(tmp_path, FAULT, "break", "1")
    assert without.returncode == broken.returncode == 0, broken.stderr
    assert broken.stdout == without.stdout and "caught" in without.stdout, (broken.stdout, without.stdout)
    assert "own wrapper 3 True" in without.stdout  # still the program's, still counting, telemetry off
    said = [line for line in broken.stderr.splitlines() if "rank telemetry is off" in line]
    assert len(said) == 1 and "a bug of fsdpctl's" in said[0]


def test_an_error_of_the_hooks_own_after_an_import_never_reaches_the_programs_import(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("startup_hook_under_test",
                                                  REPO / "fsdpctl" / "node" / "startup" / "sitecustomize.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # (not as ``sitecustomize``: nothing installed in this process)
    (tmp_path / "a_module_of_the_program.py").write_text("VALUE = 42\n")
    sys.path.insert(0, str(tmp_path))

    def bug(module):
        raise TypeError("a bug of fsdpctl's")
    try:
        hook.when_imported("a_module_of_the_program", bug)
        import a_module_of_the_program

        assert a_module_of_the_program.VALUE == 42
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("a_module_of_the_program", None)
