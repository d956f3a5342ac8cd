"""The probe's rendezvous-port check on loopback: a master whose probe starts listening after the
others' window (its facts were slow) is still reached while they are collecting theirs, and a master
that never listens is reported unreachable once both the window and the collecting are over."""

from __future__ import annotations

import socket
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
