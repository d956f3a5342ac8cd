"""Reading and grouping every rank's stack, and reading flight-recorder dumps: the parsers on the
formats faulthandler and py-spy really print, the grouping, the odd one out, and dumps from nodes read
without running any code they carry. Real ranks, signals and py-spy: tests/integration/test_hangs.py."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fsdpctl.diagnose.flight import analyse, disagreements, mismatches, read_dump
from fsdpctl.diagnose.stacks import group_stacks, rank_ranges, rank_stacks, render, summary_line, suspect
from fsdpctl.node.stacks import _catches, parse_faulthandler, parse_py_spy
from fsdpctl.node.startup.sitecustomize import DUMP_SIGNAL

REPO = Path(__file__).resolve().parents[2]
SITE = "/venv/lib/python3.11/site-packages"
FAULTHANDLER = f"""\
Thread 0x00007f5d3b47e6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f5d3b73cb80 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/runs/r/code/train.py", line 42 in step
  File "/runs/r/code/train.py", line 60 in <module>
"""


def test_faulthandler_text_becomes_threads_with_the_main_one_found():
    threads = parse_faulthandler(FAULTHANDLER)
    assert [t["main"] for t in threads] == [False, True]
    assert threads[1]["frames"][0] == {"function": "all_reduce", "line": 3252,
                                       "file": f"{SITE}/torch/distributed/distributed_c10d.py"}
    assert [f["function"] for f in threads[1]["frames"]] == ["all_reduce", "step", "<module>"]


def test_py_spy_json_becomes_the_same_shape_with_native_frames_marked():
    dump = [{"thread_name": "MainThread", "os_thread_id": 7, "frames": [
        {"name": "pthread_cond_wait", "filename": "/lib/libc.so.6", "line": 0},
        {"name": "all_reduce", "filename": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 3252},
        {"name": "step", "filename": "/runs/r/code/train.py", "line": 42}]}]
    (thread,) = parse_py_spy(dump)
    assert thread["main"] and thread["frames"][0]["native"] and "native" not in thread["frames"][1]


def stack(rank, host, node_rank, frames, method="faulthandler"):
    return {"rank": rank, "pid": 100 + rank, "method": method, "error": None,
            "threads": [{"name": "main", "main": True, "frames": frames}]}


WAITING = [{"function": "all_reduce", "file": f"{SITE}/torch/distributed/distributed_c10d.py", "line": 3252},
           {"function": "step", "file": "/runs/r/code/train.py", "line": 42}]
STUCK = [{"function": "sleep_forever", "file": "/runs/r/code/train.py", "line": 17},
         {"function": "step", "file": "/runs/r/code/train.py", "line": 40}]


def nodes_with_rank_3_stuck():
    return [{"host": "n1", "node_rank": 0, "ranks": [stack(0, "n1", 0, WAITING), stack(1, "n1", 0, WAITING)]},
            {"host": "n2", "node_rank": 1, "ranks": [stack(2, "n2", 1, WAITING), stack(3, "n2", 1, STUCK)]}]


def test_identical_stacks_fold_and_the_odd_rank_comes_first_named_by_its_user_frame():
    nodes = nodes_with_rank_3_stuck()
    # py-spy names functions by qualified name: the same place still groups together.
    nodes[0]["ranks"][1]["threads"][0]["frames"] = [{**f, "function": "X." + f["function"]} for f in WAITING]
    groups = group_stacks(rank_stacks(nodes))
    assert [g.ranks for g in groups] == [[3], [0, 1, 2]]
    assert suspect(groups) is groups[0]
    assert groups[0].headline() == "train.py:17 in sleep_forever"
    assert groups[1].headline() == "train.py:42 in step, inside all_reduce (torch/distributed/distributed_c10d.py:3252)"
    assert groups[1].label() == "ranks 0-2 on n1,n2"
    text = render(groups, nodes)
    assert text[0] == "4 rank(s) on 2 node(s) (n1: faulthandler, n2: faulthandler)"
    assert text[2] == "rank 3 on n2  (1 of 4) - the odd one out"
    assert summary_line(groups) == "rank 3 on n2 stands apart, at train.py:17 in sleep_forever"


def test_no_odd_one_when_ranks_split_evenly_or_all_stand_together():
    nodes = nodes_with_rank_3_stuck()
    nodes[0]["ranks"][1]["threads"][0]["frames"] = STUCK
    assert suspect(group_stacks(rank_stacks(nodes))) is None
    together = [{"host": "n1", "node_rank": 0, "ranks": [stack(r, "n1", 0, WAITING) for r in range(3)]}]
    groups = group_stacks(rank_stacks(together))
    assert suspect(groups) is None and summary_line(groups).startswith("every rank at train.py:42 in step")


def test_a_rank_without_a_stack_and_an_unreachable_node_are_said_so():
    nodes = nodes_with_rank_3_stuck()
    nodes[1]["ranks"][1] = {"rank": 3, "pid": 9, "method": "faulthandler", "threads": [],
                            "error": "no stack-dump handler in this process"}
    nodes.append({"host": "n3", "node_rank": 2, "ranks": [], "error": "connection refused"})
    text = "\n".join(render(group_stacks(rank_stacks(nodes)), nodes))
    assert "rank 3 on n2  (1 of 4)\n  at no stack: no stack-dump handler in this process" in text
    assert "n3: connection refused" in text and "n3: unreachable" in text


@pytest.mark.parametrize("ranks, shown", [([0, 1, 2, 5], "0-2,5"), ([3], "3"), ([0, 1, 4, 5], "0,1,4,5"),
                                          ([0, 2, 4], "0,2,4"), ([7, 8, 9, 10, 11], "7-11")])
def test_rank_ranges(ranks, shown):
    assert rank_ranges(ranks) == shown


def fr_dump(enqueued: int, ops: dict[int, tuple[str, list]]) -> dict:
    """A flight-recorder dump as torch writes it (plain data), for process group 0."""
    entries = [{"process_group": ("0", "default_pg"), "collective_seq_id": seq, "profiling_name": name,
                "input_sizes": sizes, "input_dtypes": ["Float"], "state": "scheduled",
                "frames": [{"name": "all_reduce", "filename": f"{SITE}/torch/distributed/distributed_c10d.py",
                            "line": 3252}, {"name": "step", "filename": "/runs/r/code/train.py", "line": 42}]}
               for seq, (name, sizes) in ops.items() if seq <= enqueued]
    return {"version": 4, "entries": entries, "pg_config": {"0": {"name": "0", "ranks": "[0, 1, 2]"}},
            "pg_status": {"0": {"last_enqueued_collective": enqueued, "last_completed_collective": enqueued - 1}}}


OPS = {n: ("gloo:all_reduce", [[4]]) for n in range(1, 6)}


def test_the_first_collective_a_rank_never_entered_is_named(tmp_path):
    for rank, enqueued in ((0, 5), (1, 5), (2, 4)):
        (tmp_path / f"rank_{rank}").write_bytes(pickle.dumps(fr_dump(enqueued, OPS)))
    (tmp_path / "rank_9.tmp").write_bytes(b"half a dump")  # ignored: not a rank file
    dumps = {r: read_dump(tmp_path / f"rank_{r}") for r in range(3)}
    (found,) = disagreements(dumps)
    assert (found.seq, found.entered, found.missing) == (5, [0, 1], [2])
    assert found.line() == ("process group 0: collective #5 gloo:all_reduce [[4]] ['Float'] (from train.py:42 in "
                            "step) was entered by rank(s) 0,1 but not by rank 2 (its last: #4)")
    lines, listed = analyse(tmp_path)
    assert lines[0] == f"{tmp_path.name}: dumps of rank(s) 0,1,2" and listed == [found]


def test_ranks_that_entered_different_collectives_under_one_number_are_named():
    other = {**OPS, 3: ("gloo:all_gather", [[8]])}
    dumps = {0: fr_dump(5, OPS), 1: fr_dump(5, other)}
    assert not disagreements(dumps)
    assert mismatches(dumps) == ["process group 0: collective #3 differs between ranks (rank 0: gloo:all_reduce "
                                 "[[4]]; rank 1: gloo:all_gather [[8]])"]


def test_a_dump_that_would_run_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path}/PWNED",))

    (tmp_path / "rank_0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    with pytest.raises(ValueError, match="refusing"):
        read_dump(tmp_path / "rank_0")
    assert not (tmp_path / "PWNED").exists()


def test_the_startup_hook_arms_a_rank_and_leaves_its_children_and_other_processes_alone(tmp_path):
    """A real interpreter started the way torchrun starts a rank: the dump signal is caught, a dump
    lands in the rank's file, a child inherits nothing of it, a user's own sitecustomize still runs."""
    user_site = tmp_path / "user_site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    program = textwrap.dedent("""\
        import os, subprocess, sys, time
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('FSDPCTL_RANK_HOOK_PID'))"],
                               capture_output=True, text=True).stdout.strip()
        print(os.environ.get("USER_SITE_RAN"), child == str(os.getpid()), flush=True)
        time.sleep(30)
        """)
    env = {**os.environ, "RANK": "5", "FSDPCTL_RUN_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(REPO / "fsdpctl" / "node" / "startup"), str(user_site)])}
    rank = subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().split() == ["1", "True"]  # the user's hook ran; the child saw the owner
        assert _catches(rank.pid, DUMP_SIGNAL) and DUMP_SIGNAL not in (signal.SIGUSR1, signal.SIGUSR2)
        os.kill(rank.pid, DUMP_SIGNAL)
        dump = tmp_path / "stacks" / "rank5.txt"
        deadline = time.monotonic() + 10
        while "<module>" not in (dump.read_text() if dump.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.05)
        threads = parse_faulthandler(dump.read_text())
        main = next(t for t in threads if t["main"])
        assert main["frames"][0]["function"] == "<module>" and rank.poll() is None  # dumped, still running
        assert (tmp_path / "flight" / "rank5.trigger").exists()
    finally:
        rank.kill()
        rank.wait()
    assert json.loads(json.dumps(threads))  # plain data, ready for the node's JSON answer


FREEZE_PROGRAM = """\
import gc, weakref
frozen_before = gc.get_freeze_count()
import torch
class Holder:
    pass
held = Holder()
held.self = held  # a cycle made after the import: only the collector frees it
gone = weakref.ref(held)
del held
gc.collect()
print(frozen_before, gc.get_freeze_count(), gone() is None, type(torch.__spec__.loader).__name__,
      torch.__loader__ is torch.__spec__.loader)
"""


@pytest.mark.parametrize("setting", ["default", "0"])
def test_the_startup_hook_freezes_what_importing_torch_made_and_collects_what_came_after(setting):
    """torch's import-time objects leave the collector's view right after ``import torch`` (every full
    collection and the exit's last one skip them), torch keeps its own loader, and a cycle the user
    made afterwards is still collected. ``FSDPCTL_GC_FREEZE=0`` freezes nothing."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "fsdpctl" / "node" / "startup")}
    env.pop("FSDPCTL_GC_FREEZE", None)
    if setting == "0":
        env["FSDPCTL_GC_FREEZE"] = "0"
    shown = subprocess.run([sys.executable, "-c", FREEZE_PROGRAM], env=env, capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    before, after, collected, loader, same = shown.stdout.split()
    assert before == "0" and collected == "True" and loader == "SourceFileLoader" and same == "True"
    assert int(after) > 10_000 if setting == "default" else after == "0"


def test_the_rank_telemetrys_wrappers_are_never_named_as_the_users_code():
    """A user's collective goes through fsdpctl's rank telemetry (its wrapper sits between the
    program and torch): the group is still named by the program's own frame."""
    wrapper = {"function": "Patches._comm_wrapper.<locals>.timed",
               "file": "/runs/r/pkg/fsdpctl/node/telemetry/patches.py", "line": 240}
    nodes = nodes_with_rank_3_stuck()
    for node in nodes:
        for rank in node["ranks"]:
            frames = rank["threads"][0]["frames"]
            if frames[0]["function"] == "all_reduce":
                rank["threads"][0]["frames"] = [wrapper, frames[0], wrapper, *frames[1:]]
    groups = group_stacks(rank_stacks(nodes))
    assert [g.ranks for g in groups] == [[3], [0, 1, 2]]
    assert groups[1].headline() == "train.py:42 in step, inside all_reduce (torch/distributed/distributed_c10d.py:3252)"
