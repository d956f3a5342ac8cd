"""Following a run from outside (``TailFeed``: its nodes' logs tailed, their ends polled over SSH), with
each node's link scripted: a cut link found by its silence, and a follower that does not act for the run
leaving its nodes alone. The real cut link is in tests/integration/test_elastic.py."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from fsdpctl.backends.nodes import feeds
from fsdpctl.backends.nodes.feeds import TailFeed
from fsdpctl.backends.nodes.runs import NodeRun
from fsdpctl.backends.nodes.supervisor import Supervisor
from fsdpctl.errors import HostError
from fsdpctl.plan.types import NodeSpec
from fsdpctl.rundir.outcome import NODE_LOST_EXIT
from fsdpctl.rundir.state import NodeState
from fsdpctl.shell import OUTPUT_MARK

PLAN = SimpleNamespace(run_dir="/r", run_id="r", stop_signal="TERM")  # what the supervisor reads of a plan
JOURNAL: list = []
"""The kills each scripted node received, in order."""


@pytest.fixture(autouse=True)
def _journal():
    JOURNAL.clear()
    yield
    JOURNAL.clear()


class TailedNode:
    """A node followed from outside over a scripted SSH link: its log stream stays open and quiet, a
    poll answers ``running`` until a kill ends the node; ``cut``: every command waits as on a cut link."""

    def __init__(self, host: str, cut: bool = False, refused: bool = False):
        self.host, self.cut, self.refused = host, cut, refused
        self.ended = threading.Event()
        self.polls = 0

    def stream(self, command: str):
        node = self

        class Quiet:
            def chunks(self):
                yield f"{OUTPUT_MARK}\n".encode()
                while not node.ended.wait(0.1) and not node.cut:
                    pass
                if node.cut:
                    time.sleep(20)  # a daemon thread: the test does not wait for it

            def close(self):
                pass
        return Quiet()

    def run(self, command: str, timeout: float):
        if self.cut:
            time.sleep(20)  # then fails, as SSH does in the end (long after the node timeout)
            raise HostError(self.host, "poll", "no channel within 30 s, 3 times", "")
        if self.refused:  # this follower's own link to the node, not the node
            raise HostError(self.host, "poll", "connection refused", "")
        if "FSDPCTL_RUN_ID=" in command:  # the kill
            JOURNAL.append((self.host, "killed"))
            self.ended.set()
            return 0, f"{OUTPUT_MARK}\nremaining: none\n", ""
        self.polls += 1
        return 0, f"{OUTPUT_MARK}\n{'exit 137' if self.ended.is_set() else 'running'}\n", ""


def test_a_detached_runs_follower_finds_a_cut_node_lost_after_its_silence_not_a_poll_timeout(tmp_path,
                                                                                             monkeypatch):
    """A poll to a cut link would wait for its SSH timeouts (minutes); the quiet node that answers
    its polls is not lost, and its polls do not wait behind the cut node's."""
    monkeypatch.setattr(feeds, "MIN_POLL_SILENCE", 1.5)  # 20 s on a real link
    healthy, cut = TailedNode("n1"), TailedNode("n2", cut=True)
    runs = [NodeRun(NodeSpec(node_rank=rank, host=node.host, address=f"10.0.0.{rank + 1}", nproc="2",
                             script_path="/r/node.sh", torchrun_args=()), transport=node, pid=100 + rank,
                    state=NodeState.RUNNING) for rank, node in enumerate((healthy, cut))]
    sup = Supervisor(plan=PLAN, runs=runs, log_dir=tmp_path / "logs", grace=1.0, sink=lambda line: None,
                     feed=TailFeed(node_timeout=1.0))
    result = sup.run()
    assert runs[1].state == "lost" and runs[1].lost_reason.startswith("nothing heard from it since ")
    assert "its polls go unanswered after 1.5 s" in runs[1].lost_reason
    assert runs[0].state == "failed" and runs[0].stopped and ("n1", "killed") in JOURNAL
    assert healthy.polls >= 2  # answered while the cut node's first poll still waited
    assert result.first_failure.node_rank == 1 and result.exit_code == NODE_LOST_EXIT


def test_a_follower_that_does_not_act_for_the_run_never_stops_its_nodes(tmp_path):
    """`logs -f` of a launcher's run (or of a detached run its follower owns) whose own link to a node
    fails reports that node lost, and the run's other node goes on to its own end."""
    healthy, unreachable = TailedNode("n1"), TailedNode("n2", refused=True)
    runs = [NodeRun(NodeSpec(node_rank=rank, host=node.host, address=f"10.0.0.{rank + 1}", nproc="2",
                             script_path="/r/node.sh", torchrun_args=()), transport=node, pid=100 + rank,
                    state=NodeState.RUNNING) for rank, node in enumerate((healthy, unreachable))]
    ends = threading.Timer(3.0, healthy.ended.set)
    ends.start()
    sup = Supervisor(plan=PLAN, runs=runs, log_dir=tmp_path / "logs", grace=1.0, sink=lambda line: None,
                     feed=TailFeed(), fail_fast=False, write_local=False, stop_on_interrupt=False)
    result = sup.run()
    assert runs[1].state == "lost" and "connection refused" in runs[1].lost_reason
    assert ("n1", "killed") not in JOURNAL and not runs[0].stopped
    assert runs[0].exit_code == 137 and result.first_failure.node_rank == 1
