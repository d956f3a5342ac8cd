"""Starting node scripts through the local transport: streaming, exit codes, fail-fast teardown.

The node's Python is a stand-in script (the workload itself is tested in tests/workload), so these
tests exercise the real scripts, process groups and signals in a second or two.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fsdpctl.nodes import prepare_run_dir, start_nodes, supervise
from fsdpctl.plan import make_plan
from fsdpctl.profiles import parse_profile
from fsdpctl.render import render_all
from fsdpctl.runs import RunPaths
from fsdpctl.transport import LocalTransport

STAND_IN = """\
#!/usr/bin/env python3
import os, sys, time
rank = int(os.environ["FSDPCTL_NODE_RANK"])
print(f"node {rank} starting", flush=True)
print(f"node {rank} to stderr", file=sys.stderr, flush=True)
with open(f"pid{rank}", "w") as f:
    f.write(str(os.getpid()))
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.3")))
    print(f"node {rank} failing", flush=True)
    sys.exit(3)
time.sleep(float(os.environ.get("RUN_SECONDS", "0.2")))
print(f"step=1 loss=1.0 node {rank} done", flush=True)
"""


def profile_text(tmp_path: Path, env: dict[str, str], backend: str = "ssh") -> str:
    python = tmp_path / "stand-in-python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    hosts = "hosts: [10.9.0.1, 10.9.0.2]\n" if backend == "ssh" else ""
    env_lines = "".join(f"  {k}: '{v}'\n" for k, v in env.items())
    return (f"name: t\nbackend: {backend}\n{hosts}nproc_per_node: 1\npython: {python}\n"
            f"workdir: {tmp_path}/work\nenv:\n{env_lines}")


def run(tmp_path: Path, env: dict[str, str]):
    plan = make_plan(parse_profile(profile_text(tmp_path, env), "t.yaml"), run_id="t-20261121-120000-abcd",
                     local_run_dir=str(tmp_path / "local"))
    scripts = render_all(plan)
    paths = RunPaths(tmp_path / "local")
    transports = [LocalTransport(tmp_path) for _ in plan.nodes]
    prepare_run_dir(plan, scripts, paths)
    states = start_nodes(plan, scripts, transports)
    seen: list[tuple[int, str]] = []
    started = time.monotonic()
    result = supervise(plan, states, transports, paths, lambda rank, host, line: seen.append((rank, line)),
                       grace=2.0)
    return plan, paths, result, seen, time.monotonic() - started


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_every_node_streams_and_succeeds(tmp_path):
    plan, paths, result, seen, _ = run(tmp_path, {"RUN_SECONDS": "0.1"})
    assert result.exit_code == 0 and result.first_failure is None
    assert (0, "node 0 starting") in seen and (1, "node 1 to stderr") in seen
    merged = (paths.logs / "merged.log").read_text()
    assert "[10.9.0.2 r1] step=1 loss=1.0 node 1 done" in merged
    record = json.loads(paths.run_record.read_text())
    assert record["state"] == "succeeded" and [n["exit_code"] for n in record["nodes"]] == [0, 0]
    assert json.loads(paths.plan.read_text())["run_id"] == plan.run_id
    assert (paths.scripts / "node1.sh").is_file()


def test_first_failure_stops_the_other_node(tmp_path):
    plan, paths, result, seen, elapsed = run(tmp_path, {"FAIL_RANK": "1", "RUN_SECONDS": "60"})
    assert result.exit_code == 3
    assert result.first_failure["node_rank"] == 1 and result.first_failure["host"] == "10.9.0.2"
    assert "node 1 failing" in result.first_failure["last_lines"]
    assert elapsed < 15, "the surviving node was not torn down"
    run_dir = Path(plan.run_dir)
    for rank in (0, 1):
        assert gone(int((run_dir / f"pid{rank}").read_text()))
    record = json.loads(paths.run_record.read_text())
    assert record["state"] == "failed" and record["first_failure"]["exit_code"] == 3
    assert record["nodes"][0]["exit_code"] == 128 + signal.SIGTERM


def test_ctrl_c_stops_everything_and_exits_130(tmp_path):
    (tmp_path / "cluster_profiles").mkdir()
    (tmp_path / "cluster_profiles" / "t.yaml").write_text(
        profile_text(tmp_path, {"RUN_SECONDS": "60"}, backend="local") + "\n")
    env = {**os.environ, "FSDPCTL_RUNS_DIR": str(tmp_path / "runs")}
    launcher = subprocess.Popen([sys.executable, "-m", "fsdpctl", "launch", "-p", "t"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and pid_file is None:
        pid_file = next(iter((tmp_path / "work" / "runs").glob("*/pid0")), None) \
            if (tmp_path / "work" / "runs").exists() else None
        time.sleep(0.1)
    assert pid_file is not None, launcher.communicate(timeout=5)
    time.sleep(0.3)
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=20)
    assert launcher.returncode == 130, err
    assert "interrupted" in err
    assert gone(int(pid_file.read_text()))
    record = json.loads(next((tmp_path / "runs").glob("*/run.json")).read_text())
    assert record["state"] == "interrupted"
