"""How a rank leaves: the start-up hook waits for torch's own threads before the interpreter shuts
down, records that the program has ended, and a rank that dies by a signal after that is said to
have died in Python's shutdown, its work done."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from fsdpctl.backends.torchrun import in_shutdown
from fsdpctl.node.startup.sitecustomize import ended_marker
from fsdpctl.rundir.state import Failure
from tests.conftest import REPO

STARTUP = REPO / "fsdpctl" / "node" / "startup"

SETTLE_PROGRAM = """\
import hashlib, os, sys, threading, time
sys.path.insert(0, {startup!r})
import sitecustomize as hook

def named(name, busy_s, done):
    with open(f"/proc/self/task/{{threading.get_native_id()}}/comm", "w") as comm:
        comm.write(name)  # as torch names the threads its C++ side starts
    end, data = time.monotonic() + busy_s, bytes(1 << 20)
    while time.monotonic() < end:  # running outside the GIL, as a gloo thread finishing its last work
        hashlib.sha256(data).digest()
    done.wait()

print("no_torch", round(hook.settle_torch_threads(limit_s=5), 3))
sys.modules["torch"] = object()  # as once torch is imported
print("no_torch_thread", round(hook.settle_torch_threads(limit_s=5), 3))
done = threading.Event()
threading.Thread(target=named, args=("pt_idle", 0, done), daemon=True).start()
time.sleep(0.05)
print("idle", round(hook.settle_torch_threads(limit_s=5), 3))
for name, busy in (("pt_gloo_runloop", 0.4), ("user_thread", 3.0)):
    threading.Thread(target=named, args=(name, busy, done), daemon=True).start()
time.sleep(0.05)
print("busy", round(hook.settle_torch_threads(limit_s=5), 3))
threading.Thread(target=named, args=("pt_forever", 60, done), daemon=True).start()
time.sleep(0.05)
print("capped", round(hook.settle_torch_threads(limit_s=0.5), 3))
done.set()
"""


def test_the_exit_waits_for_torchs_threads_only_while_one_of_them_runs():
    """No wait without torch or without a thread of torch's; a few polls when torch's threads are idle;
    as long as one of them runs (a user's busy thread does not count); never past the limit."""
    shown = subprocess.run([sys.executable, "-c", SETTLE_PROGRAM.format(startup=str(STARTUP))],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    waited = {line.split()[0]: float(line.split()[1]) for line in shown.stdout.splitlines()}
    assert waited["no_torch"] == waited["no_torch_thread"] == 0.0
    assert 0.0 < waited["idle"] < 0.3
    assert 0.3 <= waited["busy"] < 2.5  # the pt_ thread's 0.4 s of running, not the user's 3 s
    assert 0.5 <= waited["capped"] < 1.5


EXIT_PROGRAM = """\
import atexit, os, sys
marker = os.path.join(os.environ["FSDPCTL_RUN_DIR"], "exits", "rank3")
def mine():  # the program's own handler: its end comes before the hook's record of it
    print("mine ran; marker already there:", os.path.exists(marker), flush=True)
atexit.register(mine)
if os.fork() == 0:
    sys.exit(0)  # a child the program forked leaves through the same handlers, and records nothing
os.wait()
os.unlink(marker) if os.path.exists(marker) else print("the child left no marker", flush=True)
"""


def test_the_hook_records_the_programs_end_after_every_exit_handler(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "exits").mkdir(parents=True)
    (run_dir / "exits" / "rank3").write_text("attempt 1\n")  # an earlier attempt's, removed at the start
    env = {**os.environ, "RANK": "3", "FSDPCTL_RUN_DIR": str(run_dir), "FSDPCTL_ATTEMPT": "2",
           "PYTHONPATH": str(STARTUP)}
    env.pop("FSDPCTL_RANK_HOOK_PID", None)
    shown = subprocess.run([sys.executable, "-c", textwrap.dedent(EXIT_PROGRAM)], env=env, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == ["mine ran; marker already there: False",  # the child's handler
                                         "the child left no marker",
                                         "mine ran; marker already there: False"]
    assert (run_dir / "exits" / "rank3").read_text() == "attempt 2\n"
    assert ended_marker(str(run_dir), 3) == str(run_dir / "exits" / "rank3")


def _failure(**fields) -> Failure:
    base = dict(kind="exit", host="n2", node_rank=1, exit_code=134, signal=6, rank=1, local_rank=0)
    return Failure(**{**base, **fields})


def test_a_signal_after_the_programs_end_is_said_to_come_in_pythons_shutdown():
    markers = {"/r/exits/rank1": "attempt 2\n"}
    said = in_shutdown(_failure(), "/r", 2, markers.get)
    assert said.in_shutdown
    assert said.headline() == ("rank 1 (local rank 0) on n2 (node 1) exited 134 (SIGABRT) in Python's shutdown, "
                               "after its program had ended")
    assert Failure.from_json(said.to_json()) == said
    # another attempt's record, no record, an exit code of its own, no rank named: as it was
    assert not in_shutdown(_failure(), "/r", 3, markers.get).in_shutdown
    assert not in_shutdown(_failure(rank=4), "/r", 2, markers.get).in_shutdown
    assert not in_shutdown(_failure(signal=None, exit_code=1), "/r", 2, markers.get).in_shutdown
    assert not in_shutdown(_failure(rank=None), "/r", 2, markers.get).in_shutdown
    assert in_shutdown(None, "/r", 2, markers.get) is None
    assert "in_shutdown" not in _failure().to_json()
