"""The node protocol through the local transport: stage, detached start, follow, fail-fast, stop.

The node's Python is a stand-in script (the workload is tested in tests/workload), so these tests
exercise the real scripts, sessions and signals in seconds. Like torchrun, the stand-in starts a
child in a session of its own, which a process-group kill would miss.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fsdpctl.backends import plan_run, render_scripts
from fsdpctl.backends.nodes.runs import relative_to_run, stop_run
from fsdpctl.backends.ssh import SSHBackend
from fsdpctl.backends.transport import LocalTransport
from fsdpctl.bundle import Payload, node_payload
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.rundir.rundir import create_run

STAND_IN = """\
#!/usr/bin/env python3
import os, subprocess, sys, time
if sys.argv[1:2] == ["-c"]:  # fsdpctl's own programs (the node agent): a real Python runs them
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
rank = int(os.environ["FSDPCTL_NODE_RANK"])
# like torchrun's workers: a child in a session of its own
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
with open(f"pids{rank}", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.makedirs(f"logs/node{rank}/attempt_0", exist_ok=True)  # torchrun's log folder
with open(f"logs/node{rank}/attempt_0/stdout.log", "w") as f:
    f.write(f"node {rank} as torchrun keeps it")
print(f"node {rank} starting", flush=True)
print(f"node {rank} to stderr", file=sys.stderr, flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.5")))
    print(f"node {rank} failing", flush=True)
    os.makedirs("flight/on-timeout", exist_ok=True)  # where torch's watchdog dumps before an abort
    with open(f"flight/on-timeout/rank_{rank}", "w") as f:
        f.write("a dump")
    child.kill()
    if os.environ.get("FAIL_AS") == "signal":  # as torchrun says a rank killed after its program ended
        folder = f"logs/node{rank}/attempt_0/{rank}"
        os.makedirs(folder, exist_ok=True)
        with open(f"{folder}/error.json", "w") as f:
            f.write('{"message": {"message": "RuntimeError: in the rank itself"}}')
        os.makedirs("exits", exist_ok=True)
        with open(f"exits/rank{rank}", "w") as f:
            f.write(f"attempt {os.environ['FSDPCTL_ATTEMPT']}\\n")
        print("Root Cause (first observed failure):", f"[0]:", f"  rank      : {rank} (local_rank: 0)",
              "  exitcode  : -9 (pid: 4242)", f"  error_file: {os.getcwd()}/{folder}/error.json", sep="\\n", flush=True)
        sys.exit(137)
    sys.exit(3)
time.sleep(float(os.environ.get("RUN_SECONDS", "0.2")))
print(f"step=1 loss=1.0 node {rank} done", flush=True)
child.kill()
"""


def profile_text(tmp_path: Path, env: dict[str, str], backend: str = "ssh") -> str:
    python = tmp_path / "stand-in-python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    hosts = "hosts: [10.9.0.1, 10.9.0.2]\n" if backend == "ssh" else ""
    env_lines = "".join(f"  {k}: '{v}'\n" for k, v in env.items())
    return (f"name: t\nbackend: {backend}\n{hosts}nproc_per_node: 1\npython: {python}\n"
            f"workdir: {tmp_path}/work\nenv:\n{env_lines}")


class CountingTransport(LocalTransport):
    """This machine, keeping every command run on it (the stream and the agent's session are not
    commands)."""

    def __init__(self, cwd: Path, commands: list[str]):
        super().__init__(cwd)
        self.commands = commands

    def run(self, command: str, timeout: float, stdin: bytes | None = None):
        self.commands.append(command)
        return super().run(command, timeout, stdin)


def launch(tmp_path: Path, env: dict[str, str], commands: list[str] | None = None):
    """Start a two-node plan through the SSH backend, both "nodes" being this machine, and follow it:
    (plan, paths, outcome, lines, seconds followed, the flight-recorder dumps copied here).
    ``commands`` gets every command run on a node."""
    text = profile_text(tmp_path, env)
    profile = parse_profile(text, "t.yaml")
    plan = plan_run(profile, run_id="t-20261121-120000-abcd", local_run_dir=str(tmp_path / "local"))
    scripts = render_scripts(plan)
    kept = commands if commands is not None else []
    backend = SSHBackend(profile, connect=lambda host: CountingTransport(tmp_path, kept))
    run = create_run(plan, profile, scripts, text)
    follower = backend.start(run, Payload(node_payload(scripts)), detached=False)
    seen: list[tuple[int, str]] = []
    started = time.monotonic()
    outcome = follower.follow(lambda line: seen.append((line.node_rank, line.text)), signals=True)
    took = time.monotonic() - started
    flight = follower.copied()  # the nodes' torchrun logs and dumps, copied here as each node ended
    return plan, run.paths, outcome, seen, took, flight


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):  # gone, maybe between the two looks
        return False


def pids_of(plan, rank: int) -> list[int]:
    return [int(p) for p in (Path(plan.run_dir) / f"pids{rank}").read_text().split()]


def test_every_node_streams_and_succeeds(tmp_path):
    plan, paths, result, seen, _, _ = launch(tmp_path, {"RUN_SECONDS": "0.1"})
    assert result.exit_code == 0 and result.first_failure is None
    assert (0, "node 0 starting") in seen and (1, "node 1 to stderr") in seen
    assert any(line.startswith("fsdpctl: node 1 of 2 on ") for rank, line in seen if rank == 1)
    merged = (paths.logs / "merged.log").read_text()  # as shown: the stand-in's lines are the node's own
    assert "[10.9.0.2] step=1 loss=1.0 node 1 done" in merged
    assert "node 0 done" in (paths.logs / "node0.log").read_text()
    record = json.loads(paths.run_record.read_text())
    assert record["state"] == "succeeded" and [n["exit_code"] for n in record["nodes"]] == [0, 0]
    assert (Path(plan.run_dir) / "pkg" / "fsdpctl" / "workload" / "train.py").is_file()  # shipped


class SlowToStage(LocalTransport):
    """This machine, whose agent's command starts ``delay`` seconds late: a node staged long after
    the others, as the last of a thousand nodes staged by one launcher is."""

    def __init__(self, cwd: Path, delay: float):
        super().__init__(cwd)
        self.delay = delay

    def session(self, command: str):
        time.sleep(self.delay)
        return super().session(command)


def test_a_node_started_first_waits_past_the_node_timeout_for_the_last_ones_staging(tmp_path):
    """Node 0 gets ``go`` at once; node 1 is staged 4 s later, past the node timeout of 3 s. The
    starter's heartbeats keep node 0's agent from taking the launcher for gone meanwhile (it used to
    end its node: "its agent's connection closed before the node ended", at 64 nodes on the testbed)."""
    text = profile_text(tmp_path, {"RUN_SECONDS": "5"}) + "node_timeout: 3\n"
    profile = parse_profile(text, "t.yaml")
    plan = plan_run(profile, run_id="t-20261129-120000-abcd", local_run_dir=str(tmp_path / "local"))
    scripts = render_scripts(plan)
    backend = SSHBackend(profile, connect=lambda host: SlowToStage(tmp_path, 4.0 if host == "10.9.0.2" else 0.0))
    run = create_run(plan, profile, scripts, text)
    follower = backend.start(run, Payload(node_payload(scripts)), detached=False)
    seen: list[tuple[int, str]] = []
    outcome = follower.follow(lambda line: seen.append((line.node_rank, line.text)), signals=True)
    assert outcome.exit_code == 0 and outcome.first_failure is None, seen
    assert (0, "step=1 loss=1.0 node 0 done") in seen and (1, "step=1 loss=1.0 node 1 done") in seen
    assert not any("ended its processes" in text for _, text in seen)


def test_first_failure_stops_the_other_node_and_its_session_children(tmp_path):
    plan, paths, result, seen, elapsed, flight = launch(tmp_path, {"FAIL_RANK": "1", "RUN_SECONDS": "60"})
    assert result.exit_code == 3
    assert result.first_failure.node_rank == 1 and result.first_failure.host == "10.9.0.2"
    assert "node 1 failing" in result.first_failure.last_lines
    assert elapsed < 20, "the surviving node was not torn down"
    for pid in pids_of(plan, 0) + pids_of(plan, 1):
        assert not alive(pid), pid
    record = json.loads(paths.run_record.read_text())
    assert record["state"] == "failed" and record["first_failure"]["exit_code"] == 3
    assert record["nodes"][0]["exit_code"] == 128 + signal.SIGTERM
    # each node's torchrun logs and flight-recorder dumps were copied here as it ended, in their places
    local = paths.logs.parent
    assert [(local / "logs" / f"node{r}" / "attempt_0" / "stdout.log").read_text() for r in (0, 1)] == \
        ["node 0 as torchrun keeps it", "node 1 as torchrun keeps it"]
    assert all(not p.stat().st_mode & 0o077 for p in (local / "flight", local / "flight" / "on-timeout"))
    # (both "nodes" share one run directory here, as on a shared file system: each finds the dump)
    assert sorted(flight) == ["node 0 (10.9.0.1)", "node 1 (10.9.0.2)"]
    assert {name for names in flight.values() for name in names} == {str(local / "flight/on-timeout/rank_1")}


def test_a_failing_ranks_error_file_and_end_marker_are_read_from_the_copy_not_on_its_node(tmp_path):
    """The failing node ends first and its files are copied at once: the rank's own error and
    whether its program had ended before the signal are read here, so no shell starts on the node
    between the nodes' end and the failure being said."""
    commands: list[str] = []
    plan, paths, result, seen, _, _ = launch(tmp_path, {"FAIL_RANK": "1", "FAIL_AS": "signal", "RUN_SECONDS": "60"},
                                             commands)
    failure = result.first_failure
    assert failure.node_rank == 1 and failure.rank == 1 and failure.signal == 9, failure
    assert failure.error == "RuntimeError: in the rank itself" and failure.in_shutdown, failure
    local = paths.logs.parent
    assert (local / "exits" / "rank1").read_text() == f"attempt {plan.attempt}\n"
    assert [c for c in commands if "tar -czf" in c] and not [c for c in commands if "cat " in c], commands


def test_a_path_a_rank_names_is_placed_in_the_run_directory_only_when_it_stays_there():
    run_id = "t-20261121-120000-abcd"
    assert relative_to_run(f"/home/u/work/runs/{run_id}/logs/node1/x/error.json", run_id) == "logs/node1/x/error.json"
    assert relative_to_run(f"~/work/runs/{run_id}/exits/rank3", run_id) == "exits/rank3"
    assert relative_to_run(f"/w/runs/{run_id}/logs/node1/../../../../etc/passwd", run_id) is None
    assert relative_to_run("/w/runs/other-run/logs/node1/error.json", run_id) is None
    assert relative_to_run("/etc/passwd", run_id) is None


def test_stop_run_ends_only_that_run(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "FSDPCTL_RUN_ID": "another-run"})
    marked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True,
                              env={**os.environ, "FSDPCTL_RUN_ID": "t-20261121-120000-ffff"})
    try:
        remaining = stop_run("t-20261121-120000-ffff", [LocalTransport(tmp_path)], grace=2)
        assert remaining == {"localhost": ""}
        assert marked.wait(timeout=5) == -signal.SIGTERM
        assert other.poll() is None
    finally:
        other.kill()
        marked.kill()
        other.wait()


def local_launch(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """A foreground `fsdpctl launch` of the stand-in on this machine, once both processes of node 0 run."""
    (tmp_path / "cluster_profiles").mkdir()
    (tmp_path / "cluster_profiles" / "t.yaml").write_text(
        profile_text(tmp_path, {"RUN_SECONDS": "60"}, backend="local") + "\n")
    env = {**os.environ, "FSDPCTL_RUNS_DIR": str(tmp_path / "runs")}
    launcher = subprocess.Popen([sys.executable, "-m", "fsdpctl", "launch", "-p", "t", "--no-preflight", *extra],
                                cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid_file = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and pid_file is None:
        pid_file = next(iter((tmp_path / "work").glob("runs/*/pids0")), None)
        time.sleep(0.1)
    assert pid_file is not None, launcher.communicate(timeout=5)
    time.sleep(0.3)
    return launcher, pid_file


def test_ctrl_c_stops_everything_and_exits_130(tmp_path):
    launcher, pid_file = local_launch(tmp_path)
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, err
    assert "interrupted by SIGINT; every process of it was stopped" in err
    assert "[localhost] node 0 starting" in out and "\x1b[" not in out  # no colour codes into a pipe
    for pid in (int(p) for p in pid_file.read_text().split()):
        assert not alive(pid), pid
    record = json.loads(next((tmp_path / "runs").glob("*/run.json")).read_text())
    assert record["state"] == "interrupted"


def test_a_killed_launcher_leaves_nothing_behind(tmp_path):
    launcher, pid_file = local_launch(tmp_path)
    launcher.send_signal(signal.SIGKILL)  # no cleanup of its own: the node's agent sees its input end
    launcher.communicate(timeout=10)
    pids = [int(p) for p in pid_file.read_text().split()]
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


def test_the_poll_reply_is_read_in_one_place_and_never_raises():
    from fsdpctl.backends.nodes.commands import Exited, Gone, Running, parse_poll

    assert parse_poll("exit 3\n") == Exited(3) and parse_poll("exit -9") == Exited(-9)
    assert parse_poll("exit 0") == Exited(0)  # the agent's "!exit 0" without its "!"
    assert parse_poll("exit") == Exited(255) and parse_poll("exit 1x") == Exited(255)  # a garbled exit file
    assert parse_poll("running") == Running()
    assert parse_poll("") == Gone() and parse_poll("gone") == Gone()


def test_a_stale_attempts_wrapper_never_writes_the_next_attempts_exit_file(tmp_path, monkeypatch):
    """On a shared run directory a host that lost its link lives on; when its node script ends after
    the next attempt's node 1 started (on a spare, same file names), its end is not taken for the
    new node's: only the wrapper node1.pid names writes node1.exit."""
    from fsdpctl.backends.nodes.agent import start

    monkeypatch.chdir(tmp_path)
    # Each script takes its exit code when it starts, then waits for the file of that code.
    (tmp_path / "node1.sh").write_text(f'code=$(cat {tmp_path}/next); while [ ! -e {tmp_path}/end.$code ]; '
                                       f'do sleep 0.05; done; exit $code\n')
    deadline = time.monotonic() + 20
    pid_file = tmp_path / "node1.pid"

    def started(code: int) -> int:
        (tmp_path / "next").write_text(str(code))
        pid = start(1, {})
        while not (pid_file.exists() and pid_file.read_text().strip() == str(pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the script has read its code
        return pid

    def ended(pid: int, code: int) -> None:
        (tmp_path / f"end.{code}").touch()
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:  # started here: reaped here
            time.sleep(0.02)

    stale = started(7)
    fresh = started(0)  # the next attempt's wrapper takes the names over
    ended(stale, 7)
    assert not (tmp_path / "node1.exit").exists(), "the stale script's end was written as the new node's"
    ended(fresh, 0)
    assert (tmp_path / "node1.exit").read_text().strip() == "0"
    assert sorted(p.name for p in tmp_path.glob("node1.exit*")) == ["node1.exit"]


def test_the_heartbeat_thread_starts_once_when_every_nodes_thread_reaches_it_together():
    import threading

    from fsdpctl.backends.nodes.starter import NodeStarter

    starter = NodeStarter.__new__(NodeStarter)
    starter.beating, starter.quiet = {}, threading.Event()
    started = []
    starter.beats = threading.Thread(target=lambda: started.append(1) or starter.quiet.wait(5), daemon=True)
    starter.beats_lock = threading.Lock()
    together = threading.Barrier(32)

    def node(rank: int) -> None:
        together.wait()
        starter._keep_alive(rank, object())

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starter.quiet.set()
    starter.beats.join(5)
    assert started == [1] and len(starter.beating) == 32
