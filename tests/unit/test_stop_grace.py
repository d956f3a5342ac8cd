"""A stop that leaves time to save, on real processes shaped as torchrun leaves them: a launcher
process without ``LOCAL_RANK``, ranks with it (each in a session of its own), and a rank's own child.
The ranks alone get the stop signal, and the grace to exit by themselves; a rank that ignores it is
killed after the grace. Both ways a node ends its run: the shell command `fsdpctl stop` sends
(``kill_command``) and the node agent's own (``end_run``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from fsdpctl.backends.nodes import agent
from fsdpctl.backends.nodes.commands import kill_command
from fsdpctl.workload.config import STOP_MARKER

TREE = textwrap.dedent("""\
    import os, signal, subprocess, sys, time
    out, behaviour = sys.argv[1], sys.argv[2]
    RANK = '''
    import os, signal, subprocess, sys, time
    out, rank, behaviour = sys.argv[1], sys.argv[2], sys.argv[3]
    def saved(signum, frame):
        time.sleep(0.5)  # a checkpoint's write
        open(os.path.join(out, "rank%s.saved" % rank), "w").write(signal.Signals(signum).name)
        os._exit(0)
    if behaviour == "ignore":
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGUSR1, saved)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a data loader worker
    open(os.path.join(out, "rank%s.pid" % rank), "w").write("%d %d" % (os.getpid(), child.pid))
    while True:
        time.sleep(0.1)
    '''
    def noted(signum, frame):  # what "torchrun" got: it must not be the ranks' signal
        open(os.path.join(out, "launcher.signal"), "a").write(signal.Signals(signum).name + "\\n")
        sys.exit(1)
    signal.signal(signal.SIGUSR1, noted)
    signal.signal(signal.SIGTERM, noted)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, out, str(rank), behaviour], start_new_session=True,
                              env={**os.environ, "LOCAL_RANK": str(rank)}) for rank in (0, 1)]
    open(os.path.join(out, "launcher.pid"), "w").write(str(os.getpid()))
    for rank in ranks:
        rank.wait()
    open(os.path.join(out, "launcher.done"), "w").write("")
""")


def start_tree(tmp_path: Path, behaviour: str) -> tuple[str, subprocess.Popen]:
    run_id = f"stop-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "FSDPCTL_RUN_ID": run_id}
    env.pop("LOCAL_RANK", None)
    tree = subprocess.Popen([sys.executable, "-c", TREE, str(tmp_path), behaviour], env=env)
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"rank{r}.pid").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and tree.poll() is None, "the process tree never started"
        time.sleep(0.05)
    return run_id, tree


def pids(tmp_path: Path) -> list[int]:
    return [int(p) for r in (0, 1) for p in (tmp_path / f"rank{r}.pid").read_text().split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def via_shell(tmp_path: Path, run_id: str, grace: float, first: str | None) -> str:
    done = subprocess.run(["bash", "-c", kill_command(run_id, grace, None, first, str(tmp_path))],
                          capture_output=True, text=True, timeout=grace + 30)
    return done.stdout.strip().rsplit("remaining:", 1)[-1].strip()


def via_agent(tmp_path: Path, run_id: str, grace: float, first: str | None) -> str:
    agent.run_quietly = lambda argv, timeout: None  # the probe's, which the agent's source follows on a node
    try:
        left = agent.end_run(run_id, grace, first=getattr(signal, f"SIG{first}") if first else None,
                             marker=str(tmp_path / STOP_MARKER))
    finally:
        del agent.run_quietly
    return " ".join(map(str, left))


@pytest.mark.parametrize("end", [via_shell, via_agent], ids=["fsdpctl-stop", "node-agent"])
def test_the_ranks_alone_get_the_stop_signal_and_save_within_the_grace(tmp_path, end):
    run_id, tree = start_tree(tmp_path, "save")
    try:
        began = time.monotonic()
        assert end(tmp_path, run_id, 20.0, "USR1") == ""
        assert (tmp_path / STOP_MARKER).exists()  # the ranks can tell the stop was asked for
        took = time.monotonic() - began
        assert [(tmp_path / f"rank{r}.saved").read_text() for r in (0, 1)] == ["SIGUSR1", "SIGUSR1"]
        # "torchrun" saw its ranks exit 0 and ended by itself; it never got the ranks' signal
        assert tree.wait(10) == 0 and (tmp_path / "launcher.done").exists()
        assert not (tmp_path / "launcher.signal").exists()
        assert not any(alive(p) for p in pids(tmp_path))
        assert took < 10, f"the stop waited {took:.1f} s for ranks that had saved"
    finally:
        tree.kill()


@pytest.mark.parametrize("end", [via_shell, via_agent], ids=["fsdpctl-stop", "node-agent"])
def test_a_rank_that_ignores_the_signal_is_killed_after_the_grace(tmp_path, end):
    run_id, tree = start_tree(tmp_path, "ignore")
    try:
        began = time.monotonic()
        assert end(tmp_path, run_id, 2.0, "USR1") == ""
        took = time.monotonic() - began
        assert 2.0 <= took < 15, took
        assert not any(alive(p) for p in pids(tmp_path))
        assert tree.wait(10) != 0  # TERM after the grace: the launcher process ended by it
        assert (tmp_path / "launcher.signal").read_text() == "SIGTERM\n"
    finally:
        tree.kill()


def test_without_a_first_signal_every_process_gets_term_at_once(tmp_path):
    run_id, tree = start_tree(tmp_path, "save")
    try:
        assert via_shell(tmp_path, run_id, 5.0, None) == ""
        assert not (tmp_path / STOP_MARKER).exists()
        assert tree.wait(10) == 1 and (tmp_path / "launcher.signal").read_text().startswith("SIGTERM")
        assert not any((tmp_path / f"rank{r}.saved").exists() for r in (0, 1))  # TERM, not the save signal
    finally:
        tree.kill()


def test_the_agents_end_returns_once_the_processes_are_gone_and_starts_a_shell_only_to_clean_up(tmp_path):
    """Another node failed: TERM, and the end is said as soon as nothing of the run is left, not after
    the grace; a bare run has no containers to remove, so no shell is started for them."""
    started: list[list[str]] = []
    agent.run_quietly = lambda argv, timeout: started.append(argv)  # the probe's, on a node
    try:
        for n, cleanup in enumerate((None, "true", "echo removing containers")):
            (tmp_path / f"end{n}").mkdir()
            run_id, tree = start_tree(tmp_path / f"end{n}", "save")
            try:
                began = time.monotonic()
                assert agent.end_run(run_id, 20.0, cleanup=cleanup) == []
                assert time.monotonic() - began < 10, "the end waited out the grace"
            finally:
                tree.kill()
    finally:
        del agent.run_quietly
    assert started == [["bash", "-c", "echo removing containers"]]


def test_the_node_agent_and_the_workload_name_one_stop_marker():
    """The agent's source runs on a node with nothing of fsdpctl imported: its own copy of the name."""
    assert agent.STOP_MARKER == STOP_MARKER


def test_the_profiles_stop_signal_and_grace_reach_the_plan_the_ranks_and_the_slurm_step():
    from fsdpctl.backends import plan_run
    from fsdpctl.backends.slurm.plan import SlurmPlan
    from fsdpctl.errors import ProfileError
    from fsdpctl.profiles.loader import load_profile, parse_profile

    base = "name: x\nbackend: ssh\nhosts: [10.9.0.1, 10.9.0.2]\n"
    profile = parse_profile(base + "stop_signal: USR1\nstop_grace: 120\n", "p.yaml")
    plan = plan_run(profile, run_id="x-20261128-120000-abcd", local_run_dir="r", home="/home/me")
    assert (plan.stop_signal, plan.stop_grace) == ("USR1", 120) and plan.env["FSDPCTL_STOP_SIGNAL"] == "SIGUSR1"
    default = parse_profile(base, "p.yaml")
    assert (default.stop_signal, default.stop_grace) == ("TERM", 10)
    for field, said in (("stop_signal: KILL", "stop_signal: 'KILL' is not one of TERM, INT, HUP, USR1"),
                        ("stop_grace: 0", "stop_grace: 0 is outside 1-86400")):
        with pytest.raises(ProfileError) as raised:
            parse_profile(base + field + "\n", "p.yaml")
        assert said in str(raised.value), raised.value
    # Slurm sends the stop signal to every process of the step: torchrun must outlive USR1 (its
    # default action is to die) and hand the ignoring on; TERM it handles itself, for its ranks
    slurm = load_profile("slurm").profile
    for signal_name, trap in (("USR1", "trap '' USR1 && "), ("TERM", None)):
        changed = type(slurm)(**{**slurm.__dict__, "stop_signal": signal_name})
        step = SlurmPlan.of(plan_run(changed, run_id="slurm-20261128-120000-abcd", local_run_dir="r",
                                     home="/home/me", backend="slurm")).step_command
        assert (trap in step) if trap else ("trap" not in step), step


def test_the_agents_names_leave_the_probes_alone():
    """On a node the agent's source follows the probe's in one script: a name the agent defines at the
    top level again would replace the probe's (a stop word called END once replaced the probe's end
    mark, and every preflight waited for an answer that never came)."""
    import ast

    from fsdpctl.hostcheck.probe import probe_source

    def top_level(source: str) -> set[str]:
        names = set()
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        return names

    agent_source = Path(agent.__file__).read_text()
    watch_source = (Path(agent.__file__).parent / "agent_watch.py").read_text()
    shared = top_level(probe_source()) & (top_level(agent_source) | top_level(watch_source))
    assert not shared, f"the agent redefines the probe's {sorted(shared)}"
