"""The probe's rendezvous-port check on loopback: a master whose probe starts listening after the
others' window (its facts were slow) is still reached while they are collecting theirs, and a master
that never listens is reported unreachable once both the window and the collecting are over."""

from __future__ import annotations

import socket
import sys
import threading
import time

from fsdpctl.hostcheck.port_probe import PortCheck, listen


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_master_that_listens_after_the_window_is_reached_while_the_other_node_still_collects():
    port = free_port()
    other = PortCheck({"connect": {"addr": "127.0.0.1", "port": port, "window": 0.5}})
    heard = {}
    late = threading.Timer(1.5, lambda: heard.update(listen({"addr": "127.0.0.1", "port": port, "expect": 1,
                                                              "window": 0.5})))
    late.start()
    time.sleep(2.0)  # this node's own facts take 2 s: longer than the window
    found = other.finish()
    late.join()
    assert found["connect"]["reached"] and heard["free"] and heard["peers"] == ["127.0.0.1"]


def test_a_master_that_never_listens_is_unreachable_after_the_window_and_the_collecting():
    port = free_port()
    started = time.monotonic()
    other = PortCheck({"connect": {"addr": "127.0.0.1", "port": port, "window": 0.5}})
    time.sleep(1.0)
    found = other.finish()
    assert not found["connect"]["reached"] and "refused" in found["connect"]["error"].lower()
    assert 1.0 <= time.monotonic() - started < 3.0


def test_the_master_holds_the_port_while_it_collects_and_a_taken_port_is_said_at_once():
    port = free_port()
    master = PortCheck({"listen": {"port": port, "expect": 1, "window": 0.3, "addr": "127.0.0.1"}})
    time.sleep(1.0)  # past its window, still collecting: a late peer gets in
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    assert master.finish()["listen"]["peers"] == ["127.0.0.1"]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        taken = PortCheck({"listen": {"port": port, "expect": 1, "window": 5, "addr": "127.0.0.1"}})
        started = time.monotonic()
        assert taken.finish()["listen"]["free"] is False and time.monotonic() - started < 1


def _profile():
    from fsdpctl.profiles.loader import parse_profile

    return parse_profile("name: p\nbackend: ssh\nhosts: [a, b]\nnproc_per_node: 1\ndevice: cpu\n", "p.yaml")


def test_a_node_whose_probe_began_after_the_masters_window_is_reached_in_the_port_round_and_shown_after_it():
    """As at 256 nodes on a loaded launcher: the other node's probe is over (window 0.5 s, nobody
    listened) before the master's begins. The port round, run once every probe has answered, reaches
    the master; only then is the other node's report handed on, with the round's verdict."""
    from fsdpctl.backends.transport import LocalTransport
    from fsdpctl.hostcheck.fanout import NodeProbe, make_jobs, run_doctor, run_probe_command

    port = free_port()
    jobs = make_jobs(_profile(), [NodeProbe(0, LocalTransport()), NodeProbe(1, LocalTransport())], 0, "127.0.0.1",
                     port, deep=False, port_check=True)
    for job in jobs:
        next(iter(v for k, v in job.args.items() if k in ("listen", "connect")))["window"] = 0.5
    other_done = threading.Event()

    def runner(job, timeout):
        if job.node_rank == 0:
            assert other_done.wait(60)
        answer = run_probe_command(job, sys.executable, timeout)
        other_done.set()
        return answer

    shown = []
    report = run_doctor(_profile(), jobs, python=sys.executable, timeout=60, nproc=1, runner=runner,
                        on_host=lambda r: shown.append((r.node_rank, [c.detail for c in r.checks if c.name == "port"])))
    master, other = report.hosts
    assert [rank for rank, _ in shown] == [0, 1]  # the other's report waited for the round
    assert other.facts["connect"]["reached"] and shown[1][1] == [f"reached the master at 127.0.0.1:{port} "
                                                                 "(checked again once every probe had answered)"]
    assert master.facts["listen"]["peers"] == ["127.0.0.1"], master.checks
    assert [c.status for c in master.checks + other.checks if c.name == "port"] == ["pass", "pass"]


def _reports(port, master_facts):
    from fsdpctl.backends.transport import LocalTransport
    from fsdpctl.hostcheck.checks import Check, HostReport, port_checks
    from fsdpctl.hostcheck.fanout import HostJob

    jobs = [HostJob(0, LocalTransport(), {"listen": {"addr": "127.0.0.2", "port": port, "expect": 1, "window": 0.5}}),
            HostJob(1, LocalTransport(), {"connect": {"addr": "127.0.0.1", "port": port, "window": 0.5}})]
    other_facts = {"connect": {"addr": "127.0.0.1", "port": port, "reached": False, "error": "Connection refused"}}
    reports = [HostReport("a", 0, master_facts, [Check("reachable", "pass", "connected"), *port_checks(master_facts)]),
               HostReport("b", 1, other_facts, [Check("reachable", "pass", "connected"), *port_checks(other_facts)])]
    return jobs, reports


def test_a_node_the_port_round_cannot_reach_either_stays_failed_and_a_taken_port_gets_no_round():
    """The master listens on 127.0.0.2 only, the other tries 127.0.0.1 (a firewall, in effect): the
    round fails too and says it checked again. A master whose port was taken is that verdict: no
    round runs, nothing changes."""
    from fsdpctl.hostcheck.fanout import CommandSessions, recheck_ports

    port = free_port()
    jobs, reports = _reports(port, {"listen": {"port": port, "free": True, "peers": []}})
    recheck_ports(jobs, reports, CommandSessions(sys.executable))
    master, other = ([c for c in r.checks if c.name == "port"] for r in reports)
    assert [c.status for c in other] == ["fail"] and "refused" in other[0].detail.lower()
    assert other[0].detail.endswith("(checked again once every probe had answered)")
    assert master[0].status == "pass" and "reached by 0 node(s)" in master[0].detail

    jobs, reports = _reports(port, {"listen": {"port": port, "free": False, "peers": [], "error": "in use"}})
    before = [list(r.checks) for r in reports]
    recheck_ports(jobs, reports, CommandSessions(sys.executable))
    assert [r.checks for r in reports] == before


def test_a_session_finished_after_a_marker_hands_back_everything_said_after_it():
    """What the port round's master says after 'listening' (its answer) comes back from finish(),
    however long after the marker it comes: the rest of the output was dropped before."""
    from fsdpctl.backends.transport import LocalTransport

    session = LocalTransport().session("echo first; echo MARK; cat >/dev/null; sleep 0.3; echo after; echo end")
    assert session.read_until("MARK", 10) == "first\nMARK\n"
    assert session.finish(10) == (0, "after\nend\n", "")


def _agent(tmp_path, rank, probe):
    """A real node agent on this machine, its payload (a node script that prints) sent and its probe answered."""
    import io
    import tarfile

    from fsdpctl.backends.nodes.commands import agent_command
    from fsdpctl.backends.transport import LocalTransport
    from fsdpctl.hostcheck.probe import parse_probe_output
    from fsdpctl.hostcheck.probe_script import END

    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as archive:
        script = f"echo node {rank} ran\n".encode()
        info = tarfile.TarInfo(f"node{rank}.sh")
        info.size = len(script)
        archive.addfile(info, io.BytesIO(script))
    args = {"run_id": "r-port", "run_dir": str(tmp_path / f"run{rank}"), "rank": rank, "attempt": 1,
            "bytes": len(tar.getvalue()), "secret_bytes": 0, "probe": probe, "go_timeout": 60}
    session = LocalTransport().session(agent_command(sys.executable, args))
    session.send(tar.getvalue())
    facts = parse_probe_output(session.read_until(END, 60))
    return session, facts


class Beating:
    """An agent's session where a heartbeat follows every line sent, as the starter's may."""

    def __init__(self, session):
        self.session = session

    def send(self, data: bytes) -> None:
        self.session.send(data)
        self.session.send(b"hb\n")

    def __getattr__(self, name):
        return getattr(self.session, name)


def test_in_a_launch_the_port_round_is_asked_of_the_agents_which_then_still_start_their_nodes(tmp_path):
    """The agents that answered the probe (and wait for ``go``) answer the port round too, with no
    command of its own: the other node's probe is over before the master's begins, the round reaches
    the master, and both agents then start their node scripts. Heartbeats come between every two
    lines, as the starter sends them to staged agents: the master's wait for ``over`` and each
    agent's wait for ``go`` read past them."""
    from fsdpctl.backends.nodes.agent import AGENT_STARTED
    from fsdpctl.backends.nodes.starter import AgentSessions
    from fsdpctl.backends.transport import LocalTransport
    from fsdpctl.hostcheck.checks import HostReport, port_checks
    from fsdpctl.hostcheck.fanout import HostJob, recheck_ports

    port = free_port()
    asked = {0: {"listen": {"port": port, "expect": 1, "window": 0.5}},
             1: {"connect": {"addr": "127.0.0.1", "port": port, "window": 0.5}}}
    other, other_facts = _agent(tmp_path, 1, {"workdir": str(tmp_path), **asked[1]})
    master, master_facts = _agent(tmp_path, 0, {"workdir": str(tmp_path), **asked[0]})
    assert not other_facts["connect"]["reached"]  # nobody listened while it tried
    for session in (master, other):
        session.send(b"hb\n")  # while it waits for its word
    jobs = [HostJob(rank, LocalTransport(), asked[rank]) for rank in (0, 1)]
    reports = [HostReport("a", 0, master_facts, port_checks(master_facts)),
               HostReport("b", 1, other_facts, port_checks(other_facts))]
    recheck_ports(jobs, reports, AgentSessions({0: Beating(master), 1: Beating(other)}))
    assert [c.status for r in reports for c in r.checks] == ["pass", "pass"], reports
    assert reports[0].facts["listen"]["peers"] == ["127.0.0.1"]
    for session in (master, other):
        session.send(b"go 0\n")
        assert AGENT_STARTED in session.read_until(AGENT_STARTED, 30)
        assert session.finish(30)[0] == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all((tmp_path / f"run{r}" / f"node{r}.exit").exists() for r in (0, 1)):
        time.sleep(0.05)
    assert [(tmp_path / f"run{r}" / f"node{r}.log").read_text() for r in (0, 1)] == ["node 0 ran\n", "node 1 ran\n"]
