"""The supervisor's own decisions, with each node agent's session scripted: a monitoring thread that
raises, a node that falls silent, and a second stop signal. The real agents, signals and a real cut link
are in tests/integration/test_resilience.py."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fsdpctl.backends.nodes import supervisor as supervisor_module
from fsdpctl.backends.nodes.feeds import AgentFeed
from fsdpctl.backends.nodes.runs import NodeRun
from fsdpctl.backends.nodes.supervisor import Supervisor
from fsdpctl.errors import HostError
from fsdpctl.plan.types import NodeSpec
from fsdpctl.rundir.outcome import NODE_LOST_EXIT
from fsdpctl.rundir.state import Failure, NodeState

PLAN = SimpleNamespace(run_dir="/r", run_id="r", stop_signal="TERM")  # what the supervisor reads of a plan


JOURNAL: list = []
"""What happened, in order: the orders each scripted agent received (``(agent, order)``) and what a test
did meanwhile (a signal sent, a wait over): the tests assert the order of events, never wall times."""


@pytest.fixture(autouse=True)
def _journal():
    JOURNAL.clear()
    yield
    JOURNAL.clear()


class ScriptedAgent:
    """A node agent's session: sends a frame of its log, says it is alive, obeys stop and kill the way
    the real agent does."""

    def __init__(self, fail_with: Exception | None = None, silent: bool = False):
        self.fail_with, self.silent = fail_with, silent
        self.out: queue.Queue[bytes | None] = queue.Queue()
        self.buffer = b""
        self.ended = False
        self.received: list[bytes] = []
        self.closed = False
        line = b"[rank0]:step=1 loss=4.0\n"
        self.out.put(b"|%d\n" % len(line) + line)

    def send(self, data: bytes) -> None:
        self.received.append(data)
        JOURNAL.append((self, data))
        if data == b"kill\n":
            self.end(137)
        # "stop" starts the agent's grace period: this one only ends on kill

    def end(self, code: int) -> None:
        self.out.put(f"!exit {code}\n".encode())
        self.out.put(None)  # the agent leaves after its exit line: end of output

    def _more(self, timeout: float) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        if self.silent:
            time.sleep(timeout)
            raise HostError("n", "timeout", "no answer", "")
        try:
            item = self.out.get(timeout=timeout)
        except queue.Empty:
            item = b"!alive\n"  # the real agent says so every few seconds
        if item is None:
            self.ended = True
        else:
            self.buffer += item

    def read_line_bytes(self, timeout: float) -> bytes:
        while b"\n" not in self.buffer and not self.ended:
            self._more(timeout)
        end = self.buffer.find(b"\n") + 1 or len(self.buffer)
        line, self.buffer = self.buffer[:end], self.buffer[end:]
        return line

    def read_exactly(self, count: int, timeout: float) -> bytes:
        while len(self.buffer) < count and not self.ended:
            self._more(timeout)
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    def close(self) -> None:
        self.closed = True


def supervise(tmp_path: Path, agents: list[ScriptedAgent], node_timeout: float = 30.0, grace: float = 10.0):
    runs = []
    for rank, agent in enumerate(agents):
        node = NodeSpec(node_rank=rank, host=f"n{rank + 1}", address=f"10.0.0.{rank + 1}", nproc="2",
                        script_path="/r/node.sh", torchrun_args=())
        runs.append(NodeRun(node, transport=None, pid=100 + rank, state=NodeState.RUNNING, session=agent))
    shown: list[str] = []
    sup = Supervisor(plan=PLAN, runs=runs, log_dir=tmp_path / "logs", grace=grace, signals=True,
                     sink=lambda line: shown.append(f"[{line.host}] {line.text}"), feed=AgentFeed(node_timeout))
    return sup.run(), runs, shown


def journal_of(*events) -> list:
    """The journal with only ``events`` (strings, or agents: their orders but heartbeats)."""
    kept = []
    for entry in JOURNAL:
        if isinstance(entry, tuple):
            agent, data = entry
            if agent in events and data != b"hb\n":
                kept.append((agent, data))
        elif entry in events:
            kept.append(entry)
    return kept


def test_a_monitoring_thread_that_raises_makes_its_node_lost_and_stops_the_others(tmp_path):
    broken, healthy = ScriptedAgent(fail_with=RuntimeError("unexpected reply")), ScriptedAgent()
    # The healthy node ends when told to; another node being lost, it is told to KILL at once: its
    # ranks wait on the lost peer in a collective and would never reach a handler in a grace period.
    healthy.send = lambda data, agent=healthy: (agent.received.append(data), agent.end(137))
    result, runs, _ = supervise(tmp_path, [broken, healthy])
    assert runs[0].state == "lost" and runs[0].lost_reason == "RuntimeError: unexpected reply"
    assert healthy.received[:1] == [b"kill\n"]  # at once: not even a heartbeat before it
    assert result.exit_code == NODE_LOST_EXIT and result.first_failure.node_rank == 0
    assert result.first_failure.kind == "lost" and result.first_failure.detail == "RuntimeError: unexpected reply"
    assert broken.closed and healthy.closed  # the agents see their input end


def test_a_silent_node_is_lost_after_the_node_timeout_and_named_with_since_when(tmp_path):
    silent, healthy = ScriptedAgent(silent=True), ScriptedAgent()
    healthy.send = lambda data, agent=healthy: (agent.received.append(data),
                                                 data != b"hb\n" and agent.end(143))
    result, runs, _ = supervise(tmp_path, [healthy, silent], node_timeout=1.5)
    assert runs[1].state == "lost"
    assert runs[1].lost_reason.startswith("nothing heard from it since ")
    assert "the node timeout is 1.5 s" in runs[1].lost_reason
    orders = [data for data in healthy.received]
    assert orders[0] == b"hb\n" and orders[-1] != b"hb\n"  # heartbeats went out while waiting, then the stop
    assert result.first_failure.node_rank == 1 and result.exit_code == NODE_LOST_EXIT


def test_a_second_signal_skips_the_grace_period(tmp_path):
    agents = [ScriptedAgent(), ScriptedAgent()]

    done, rescued = threading.Event(), []

    def signal_twice():
        time.sleep(0.5)
        JOURNAL.append("first signal")
        os.kill(os.getpid(), signal.SIGTERM)
        while not all(b"stop\n" in agent.received for agent in agents):
            time.sleep(0.05)
        JOURNAL.append("second signal")
        os.kill(os.getpid(), signal.SIGTERM)
        if not done.wait(120):  # only where the second signal was not heeded: the test fails, it does not hang
            rescued.append(True)
            for agent in agents:
                agent.end(137)

    threading.Thread(target=signal_twice, daemon=True).start()
    result, runs, shown = supervise(tmp_path, agents, grace=3600.0)  # a grace period no test waits out
    done.set()
    assert not rescued
    assert result.interrupted and result.signal == signal.SIGTERM and result.exit_code == 143
    first, second = agents
    events = journal_of("first signal", "second signal", first, second)
    assert events[0] == "first signal" and events[3] == "second signal", events
    assert {events[1], events[2]} == {(first, b"stop\n"), (second, b"stop\n")}
    assert set(events[4:]) == {(first, b"kill\n"), (second, b"kill\n")}
    assert result.first_failure is None  # the nodes ended because they were told to
    assert "[n1] step=1 loss=4.0" in shown and (tmp_path / "logs" / "node0.log").read_bytes() == \
        b"[rank0]:step=1 loss=4.0\n"  # the node's log, byte for byte
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the launcher's handlers are put back


def watched(tmp_path: Path, agents: list[ScriptedAgent], on_hang, timeout: float = 0.6):
    from fsdpctl.backends.hang_watch import HangWatch

    runs = []
    for rank, agent in enumerate(agents):
        node = NodeSpec(node_rank=rank, host=f"n{rank + 1}", address=f"10.0.0.{rank + 1}", nproc="2",
                        script_path="/r/node.sh", torchrun_args=())
        runs.append(NodeRun(node, transport=None, pid=100 + rank, state=NodeState.RUNNING, session=agent))
    watch = HangWatch(timeout, on_hang)
    return Supervisor(plan=PLAN, runs=runs, log_dir=tmp_path / "logs", sink=lambda line: None,
                      feed=AgentFeed(30.0), watch=watch).run(), runs


def test_a_hang_the_handler_ends_stops_every_node_and_exits_124(tmp_path):
    from fsdpctl.backends.hang_watch import HangVerdict

    agents = [ScriptedAgent(), ScriptedAgent()]
    for agent in agents:  # the real agent's halt: TERM (hung ranks get no time to save), and the node ends
        agent.send = lambda data, agent=agent: (agent.received.append(data), data == b"halt\n" and agent.end(143))
    calls = []
    failure = Failure(kind="hang", detail="no progress", rank=1, host="n1", node_rank=0, exit_code=124)
    result, runs = watched(tmp_path, agents, lambda silent: (calls.append(silent), HangVerdict(True, failure))[1])
    assert len(calls) == 1 and calls[0] > 0.6
    assert result.exit_code == 124 and result.hung and result.first_failure is failure
    assert all(agent.received == [b"halt\n"] for agent in agents)
    assert {r.state for r in runs} == {"failed"}


def test_on_hang_keep_reports_once_per_stall_and_the_run_goes_on(tmp_path):
    from fsdpctl.backends.hang_watch import HangVerdict

    agent = ScriptedAgent()
    calls = []

    def on_hang(silent):
        calls.append(silent)
        if len(calls) == 1:
            agent.out.put(b"|17\nstep=2 loss=3.0\n")  # progress after the first report: a new stall may be reported
        else:
            agent.end(0)
        return HangVerdict(False, Failure(kind="hang", detail="no progress", host=None, node_rank=None,
                                          exit_code=124))

    result, runs = watched(tmp_path, [agent], on_hang)
    assert len(calls) == 2  # one report per stall, not one per check
    assert result.exit_code == 0 and not result.hung and runs[0].state == "succeeded"
    assert not [d for d in agent.received if d != b"hb\n"]  # never told to stop


ROOT_CAUSE = """[rank0]:Traceback (most recent call last):
[rank0]:RuntimeError: the rank's own error
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_10:15:00
  host      : n1
  rank      : 0 (local rank: 0)
  exitcode  : 3 (pid: 4242)
  error_file: <N/A>
""".replace("local rank", "local_rank")


class SlowTerminal:
    """A sink that takes each batch of lines slower than the drain's patience (a loaded CI machine)."""

    def __init__(self, seconds: float):
        self.seconds, self.shown = seconds, []

    def __call__(self, line) -> None:
        self.lines([line])

    def lines(self, batch) -> None:
        time.sleep(self.seconds)
        self.shown.extend(line.text for line in batch)


def test_a_failure_summary_behind_a_slow_terminal_still_decides_the_exit_code(tmp_path, monkeypatch):
    """The agent says the node ended ahead of the log still waiting (fail fast); torchrun's summary
    of the rank's exit 3 is at the end of that log. However slow the launcher is to show the flood
    before it, the run is settled from it: exit 3, rank 0, not torchrun's own 1."""
    monkeypatch.setattr(supervisor_module, "DRAIN_SECONDS", 0.2)
    monkeypatch.setattr(supervisor_module, "ROOM_CHUNKS", 1)  # the feed waits for the terminal at every chunk
    failing, other = ScriptedAgent(), ScriptedAgent()
    other.send = lambda data, agent=other: (agent.received.append(data), data == b"fail\n" and agent.end(143))
    failing.out.put(b"!exit 1\n")  # torchrun's own exit status when a worker failed
    for i in range(6):
        chunk = "".join(f"[rank0]:flood {i} {n}\n" for n in range(200)).encode()
        failing.out.put(b"|%d\n" % len(chunk) + chunk)
    summary = ROOT_CAUSE.encode()
    failing.out.put(b"|%d\n" % len(summary) + summary)
    failing.out.put(None)
    node = NodeSpec(node_rank=0, host="n1", address="10.0.0.1", nproc="1", script_path="/r/n.sh", torchrun_args=())
    runs = [NodeRun(node, transport=None, pid=100, state=NodeState.RUNNING, session=failing),
            NodeRun(NodeSpec(**{**node.__dict__, "node_rank": 1, "host": "n2"}), transport=None, pid=101,
                    state=NodeState.RUNNING, session=other)]
    terminal = SlowTerminal(0.4)
    result = Supervisor(plan=PLAN, runs=runs, log_dir=tmp_path / "logs", sink=terminal, feed=AgentFeed(30.0),
                        signals=True).run()
    assert "[rank0]:RuntimeError: the rank's own error" not in terminal.shown  # shown without torchrun's prefix
    assert "RuntimeError: the rank's own error" in terminal.shown
    assert result.exit_code == 3 and result.first_failure.rank == 0, result
    assert other.received[:1] == [b"fail\n"]


STORE_LOST = """Traceback (most recent call last):
  File "torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py", line 116, in _call_store
torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has failed. \
See inner exception for details.
"""


def store_race(store_host: ScriptedAgent, last_words: str) -> ScriptedAgent:
    """Node 0 holds the rendezvous store; node 1's torchrun ends at once with ``last_words``. Node 0,
    told to stop or fail, ends at once without a summary (a torchrun stopped mid-way)."""
    store_host.send = lambda data, agent=store_host: (agent.received.append(data), JOURNAL.append((agent, data)),
                                                      data in (b"fail\n", b"stop\n", b"kill\n") and agent.end(143))
    other = ScriptedAgent()
    other.out.put(b"|%d\n" % len(last_words.encode()) + last_words.encode())
    other.end(1)
    return other


def orders(agent: ScriptedAgent) -> list[bytes]:
    return [data for data in agent.received if data != b"hb\n"]


def test_a_node_that_only_lost_the_store_waits_for_the_store_nodes_own_failure(tmp_path):
    """Under load, a second node's news of the store's loss can come before the store's node says
    why it closed it (its rank 0 exited 3: torchrun copies the rank's output before its summary).
    The store's node is not stopped in between, and the run is its rank's: exit 3, rank 0."""
    store_host = ScriptedAgent()
    other = store_race(store_host, STORE_LOST)

    def own_failure():
        time.sleep(1.0)
        store_host.out.put(b"|%d\n" % len(ROOT_CAUSE.encode()) + ROOT_CAUSE.encode())
        store_host.end(1)

    threading.Thread(target=own_failure, daemon=True).start()
    result, runs, _ = supervise(tmp_path, [store_host, other])
    assert orders(store_host) == [] and not runs[0].stopped
    assert result.exit_code == 3 and result.first_failure.rank == 0 and result.first_failure.node_rank == 0, result


def test_the_store_node_is_waited_for_a_bounded_time_and_not_for_other_failures(tmp_path, monkeypatch):
    """A store's node that does not end is stopped after the wait (here 1 s); a node that failed for
    any other reason stops the others at once, as before."""
    from fsdpctl.backends.nodes import store_wait

    monkeypatch.setattr(store_wait, "GRACE_SECONDS", 1.0)
    begin, over = store_wait.StoreWait.begin.__func__, store_wait.StoreWait.over

    def began(cls, failed, host, now):
        wait = begin(cls, failed, host, now)
        JOURNAL.append("store wait begins" if wait is not None else "no store wait")
        return wait

    def ended(self, now):
        if not over(self, now):
            return False
        if not self.seen:
            JOURNAL.append("store wait over: not the store's loss")
        elif now - self.began >= store_wait.GRACE_SECONDS and self.host.state == NodeState.RUNNING:
            JOURNAL.append("store wait over: its time is up")
        else:
            JOURNAL.append("store wait over: other")
        return True
    monkeypatch.setattr(store_wait.StoreWait, "begin", classmethod(began))
    monkeypatch.setattr(store_wait.StoreWait, "over", ended)
    store_host = ScriptedAgent()
    result, runs, _ = supervise(tmp_path, [store_host, store_race(store_host, STORE_LOST)])
    assert journal_of("store wait begins", "no store wait", "store wait over: its time is up",
                      "store wait over: other", store_host) == [
        "store wait begins", "store wait over: its time is up", (store_host, b"fail\n")]
    assert runs[0].stopped and result.first_failure.node_rank == 1 and result.exit_code == 1

    JOURNAL.clear()
    store_host = ScriptedAgent()
    result, runs, _ = supervise(tmp_path / "2", [store_host, store_race(store_host, "ValueError: bad\n")])
    said = journal_of("store wait begins", "no store wait", "store wait over: not the store's loss",
                      "store wait over: its time is up", "store wait over: other", store_host)
    assert said in (["no store wait", (store_host, b"fail\n")],  # at once: no wait, or one its lines end
                    ["store wait begins", "store wait over: not the store's loss", (store_host, b"fail\n")]), said
