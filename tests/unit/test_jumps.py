"""Jump hosts as OpenSSH follows them, one shared connection per jump host, paced handshakes."""

from __future__ import annotations

import threading

import pytest

from fsdpctl.backends.ssh.jumps import (
    CONNECT_TRIES,
    HANDSHAKES_AT_ONCE,
    HANDSHAKES_PER_SSHD,
    RETRY_PAUSE_CAP,
    Hop,
    Jumps,
    handshake_slot,
    jump_chain,
    retry_pause,
    sshd_slots,
)


def test_a_proxyjump_chain_is_read_as_openssh_writes_it():
    assert jump_chain("bastion") == [Hop("bastion")]
    assert jump_chain("alice@a, bob@b:2222,[fd00::1]:22") == [Hop("a", "alice"), Hop("b", "bob", 2222),
                                                              Hop("fd00::1", None, 22)]
    assert str(Hop("b", "bob", 2222)) == "bob@b:2222"
    for bad in ("a,,b", "a:port", "@:22"):
        with pytest.raises(ValueError, match="is not \\[user@\\]host\\[:port\\]"):
            jump_chain(bad)


class Live:
    """A paramiko client whose transport is up."""

    def get_transport(self):
        return self

    def is_active(self):
        return True


class FakeJump:
    """A jump host's connection: counts its connects and closes."""

    def __init__(self):
        self.client, self.connects, self.closed = None, 0, 0

    def connect(self):
        if self.client is None:
            self.connects += 1
            self.client = Live()

    def close(self):
        self.closed += 1
        self.client = None


def test_hosts_behind_one_jump_host_share_one_connection_until_the_last_lets_go():
    pool, made = Jumps(), []

    def make():
        made.append(FakeJump())
        return made[-1]

    held = []
    threads = [threading.Thread(target=lambda: held.append(pool.acquire(("bastion",), make))) for _ in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and made[0].connects == 1 and all(h is made[0] for h in held)
    for transport in held[:-1]:
        pool.release(("bastion",), transport)
    assert made[0].closed == 0
    pool.release(("bastion",), held[-1])
    assert made[0].closed == 1
    assert pool.acquire(("bastion",), make) is made[1]  # a new connection once the last one closed


def test_a_jump_host_that_fails_to_connect_is_not_kept():
    pool = Jumps()

    class Refusing(FakeJump):
        def connect(self):
            raise OSError("refused")

    with pytest.raises(OSError):
        pool.acquire(("b",), Refusing)
    assert pool.held == {}


def test_handshakes_to_one_sshd_are_bounded_below_openssh_maxstartups():
    slot = sshd_slots("10.0.0.9", 22)
    assert slot is sshd_slots("10.0.0.9", 22) and slot is not sshd_slots("10.0.0.9", 2222)
    taken = [slot.acquire(blocking=False) for _ in range(HANDSHAKES_PER_SSHD + 1)]
    assert taken == [True] * HANDSHAKES_PER_SSHD + [False] and HANDSHAKES_PER_SSHD < 10
    for _ in range(HANDSHAKES_PER_SSHD):
        slot.release()


def test_handshakes_to_all_hosts_at_once_are_bounded_and_each_waits_for_both_slots():
    import time

    under_way, most, lock, done = [0], [0], threading.Lock(), threading.Event()

    def handshake(host: str) -> None:
        with handshake_slot(host, 22):
            with lock:
                under_way[0] += 1
                most[0] = max(most[0], under_way[0])
            done.wait(30)  # a handshake that takes its time: the others wait for a slot
            with lock:
                under_way[0] -= 1

    threads = [threading.Thread(target=handshake, args=(f"10.1.{i // 200}.{i % 200}",)) for i in range(300)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while most[0] < HANDSHAKES_AT_ONCE and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # room for any past the bound to show
    held = most[0]
    done.set()
    for thread in threads:
        thread.join(30)
    assert held == HANDSHAKES_AT_ONCE and under_way[0] == 0, (held, under_way)  # 300 hosts: the process's bound
    assert HANDSHAKES_AT_ONCE * 0.007 < 1.0  # at the measured 7 ms each, far inside a connect timeout


def test_the_pauses_before_another_try_double_up_to_a_cap_and_are_spread():
    pauses = [[retry_pause(n) for _ in range(200)] for n in range(1, CONNECT_TRIES)]
    for n, seen in enumerate(pauses, start=1):
        base = min(RETRY_PAUSE_CAP, 0.5 * 2 ** (n - 1))
        assert all(0.5 * base <= p <= 1.5 * base for p in seen)
        assert max(seen) - min(seen) > 0.5 * base  # spread: not all at the same moment
    assert 10 < sum(min(RETRY_PAUSE_CAP, 0.5 * 2 ** (n - 1)) for n in range(1, CONNECT_TRIES)) < 60


def test_a_connection_dropped_while_set_up_is_worth_another_try_and_a_refusal_is_not():
    import socket

    import paramiko

    from fsdpctl.backends.ssh.transport import _dropped

    assert _dropped(ConnectionResetError(104, "Connection reset by peer"))
    assert _dropped(paramiko.SSHException("Error reading SSH protocol banner"))
    assert _dropped(EOFError())
    assert not _dropped(paramiko.AuthenticationException("Authentication failed."))
    assert not _dropped(socket.gaierror(-2, "Name or service not known"))
    assert not _dropped(ConnectionRefusedError(111, "Connection refused"))
    assert not _dropped(TimeoutError("timed out"))


def test_a_handshake_that_does_not_end_within_the_timeout_is_tried_again_and_then_named(tmp_path, monkeypatch):
    """A server that sends its banner and then says nothing more, as a host (or a launcher) too loaded
    to finish the key exchange in time: paramiko's start_client returns silently at the timeout and
    the next step says "No existing session". That is tried again, and in the end named as what it is."""
    import socket

    import paramiko

    from fsdpctl.backends.ssh import transport
    from fsdpctl.errors import HostError
    from fsdpctl.profiles.schema import SSHSpec

    assert transport._dropped(paramiko.SSHException("No existing session"))
    assert transport._dropped(paramiko.AuthenticationException("Authentication timeout."))
    assert not transport._dropped(paramiko.AuthenticationException("Authentication failed."))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")  # then nothing: the key exchange never ends

    threading.Thread(target=serve, daemon=True).start()
    monkeypatch.setattr(transport, "CONNECT_TRIES", 3)
    monkeypatch.setattr(transport, "retry_pause", lambda dropped: 0.0)
    known = tmp_path / "known_hosts"
    known.write_text("")
    ssh = SSHSpec(user="me", port=listener.getsockname()[1], identity_file=str(tmp_path / "none"),
                  known_hosts=str(known), connect_timeout=0.5)
    host = transport.SSHTransport("127.0.0.1", ssh, paramiko.SSHConfig())
    try:
        with pytest.raises(HostError) as raised:
            host.connect()
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert len(accepted) == 3 and len(host.drops) == 2  # tried again twice, each time recorded
    assert "handshake with 127.0.0.1" in raised.value.detail and "did not end within 0.5 s (tried 3 times)" in \
        raised.value.detail, raised.value.detail
    assert "connect_timeout" in raised.value.hint
