"""Where the rendezvous is, and what a launch's seconds went on, on the namespace testbed (n1, n2).

``rendezvous.host`` set to each host in turn, with c10d and with static: every run finishes, and the
ranks' MASTER_ADDR (the store) is the host the profile names (under static that host is node rank 0).
A rendezvous that cannot complete says what it waits for, and ends at its stated timeout. The
launch's timeline has its phases, in order, with every node in the nodes' phases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_launch import run, run_dir_of, write_profile

pytestmark = pytest.mark.integration

PROGRAM = """\
import os, socket, time
print(f"where host={socket.gethostname()} node={os.environ['FSDPCTL_NODE_RANK']} "
      f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} rank={os.environ['RANK']}", flush=True)
time.sleep(1)
"""


def program(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "where.py").write_text(PROGRAM)
    return code


def profile_with(lab, tmp_path: Path, rendezvous: str, name: str, setup: str = "") -> Path:
    path = write_profile(lab, tmp_path, name=name)
    path.write_text(path.read_text() + rendezvous + setup)
    return path


def where_lines(result) -> list[dict[str, str]]:
    found = []
    for line in result.stdout.splitlines():
        if "where host=" in line:
            found.append(dict(word.split("=", 1) for word in line.split("where ", 1)[1].split()))
    return found


@pytest.mark.parametrize("backend", ["c10d", "static"])
def test_the_rendezvous_is_on_the_host_the_profile_names(lab, tmp_path, backend):
    code = program(tmp_path)
    for host in ("n2",):  # n1 holds it when none is named: only another host shows the setting at work
        address = lab.hosts[host].address
        path = profile_with(lab, tmp_path, f"rendezvous:\n  backend: {backend}\n  host: {address}\n",
                            name=f"{backend}-{host}")
        result = run(lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--", "where.py", timeout=240)
        assert result.returncode == 0, (backend, host, result.stdout[-3000:], result.stderr[-2000:])
        said = where_lines(result)
        assert sorted(s["host"] for s in said) == ["n1", "n2"], result.stdout[-2000:]
        plan = json.loads((run_dir_of(tmp_path) / "plan.json").read_text())
        if backend == "static":  # static's store is node rank 0's: the named host is node rank 0, the master
            assert all(s["master"].split(":")[0] == address for s in said), (backend, host, said)
            assert next(s["node"] for s in said if s["host"] == host) == "0", said
            assert plan["nodes"][0]["host"] == address
        else:  # c10d's store is at the endpoint every torchrun was given; the ranks' master is global rank 0's
            assert all(f"{address}:{plan['master_port']}" in node["torchrun_args"] for node in plan["nodes"])
            rank0 = next(s["host"] for s in said if s["rank"] == "0")
            assert all(s["master"].split(":")[0] == lab.hosts[rank0].address for s in said), said


def test_a_rendezvous_that_waits_says_on_what_and_ends_at_its_timeout(lab, tmp_path):
    """n2's node script waits before torchrun (a slow setup line): node 0's torchrun waits at the
    rendezvous; the launcher says so once the notice is due, and the run ends at the timeout."""
    code = program(tmp_path)
    path = profile_with(lab, tmp_path, "rendezvous:\n  timeout: 30\n", name="waits",
                        setup='setup:\n  - \'if [ "$(hostname)" = n2 ]; then sleep 120; fi\'\n')
    result = run(lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--", "where.py", timeout=240)
    assert result.returncode != 0
    said = [line for line in result.stdout.splitlines() if "no rank has started here after" in line]
    assert said, result.stdout[-3000:]
    assert "torchrun waits for all 2 nodes at the rendezvous (c10d: the store at" in said[0]
    assert "torchrun has started on 1 of 2 nodes; it gives up after 30 s (rendezvous.timeout)" in said[0]
    assert len(said) == 1 and lab.hosts["n1"].address in said[0].split("]")[0], said  # said of node 0
    before = [line for line in result.stdout.splitlines() if "torchrun has not started here after" in line]
    assert len(before) == 1 and lab.hosts["n2"].address in before[0].split("]")[0], before  # n2 is in its setup
    assert "node script is still before it" in before[0]
    # the run's verdict names the timeout on node 0, not node 1 ended by fsdpctl on its way out
    verdict = next(line for line in (result.stdout + result.stderr).splitlines() if " FAILED: " in line)
    assert "(node 0) exited" in verdict and "was lost" not in verdict, verdict


def test_a_launchs_timeline_has_its_phases_in_order(lab, tmp_path):
    path = write_profile(lab, tmp_path, steps=4, name="timed")
    result = run(lab, tmp_path, "launch", "-p", str(path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    timed = run(lab, tmp_path, "status", "--timings", "--json")
    rows = json.loads(timed.stdout)["timeline"]
    assert_ordered(rows, nodes=2, launcher=("startup", "plan", "parity"),
                   node_phases=("connect", "stage", "probe", "agents", "torchrun", "rendezvous", "first_line",
                                "first_step", "last_line", "exit", "logs"))
    text = run(lab, tmp_path, "status", "--timings").stdout
    assert "rendezvous done (ranks started)" in text and "first step" in text, text


def assert_ordered(rows: list[dict], *, nodes: int, launcher: tuple[str, ...], node_phases: tuple[str, ...]) -> None:
    """Every phase present; each one done no earlier than the one before; the nodes' phases have
    every node (with the slowest named)."""
    by_phase = {row["phase"]: row for row in rows}
    expected = [*launcher, *node_phases]
    missing = [phase for phase in expected if phase not in by_phase]
    assert not missing, (missing, rows)
    order = [row["phase"] for row in rows]
    assert [p for p in order if p in expected] == sorted(expected, key=order.index)
    # each phase done no earlier than the one before (the node's exit and its stream's end come in
    # either order; moments of one batch of lines a few ms apart)
    chain = [p for p in order if p in expected and p not in ("last_line", "logs")]
    done = [by_phase[p]["done"] for p in chain]
    assert all(b >= a - 0.05 for a, b in zip(done, done[1:], strict=False)), list(zip(chain, done, strict=True))
    assert by_phase["logs"]["done"] >= by_phase["last_line"]["done"] - 0.05
    for phase in node_phases:
        if phase in ("first_line", "first_step", "last_line"):  # the bundled workload: rank 0 says the steps
            assert by_phase[phase]["nodes"] >= 1, by_phase[phase]
            continue
        assert by_phase[phase]["nodes"] == nodes, by_phase[phase]
        if nodes > 1:
            assert "slowest_node" in by_phase[phase]
