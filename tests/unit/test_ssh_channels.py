"""A channel slow to open is opened again, and the one that timed out is closed when it comes: a real
paramiko client and server over a socket pair, the server slow to answer the first channel."""

from __future__ import annotations

import functools
import socket
import threading
import time

import paramiko
import pytest

from fsdpctl.backends.ssh import channels
from fsdpctl.backends.ssh.channels import ChannelOpener, ChannelTimeout
from fsdpctl.backends.ssh.transport import open_session_once


class SlowSessions(paramiko.ServerInterface):
    """Accepts any user, and answers its first ``slow`` channel requests after ``delay`` seconds."""

    def __init__(self, delay: float, slow: int):
        self.delay, self.slow, self.requests = delay, slow, 0

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        self.requests += 1
        if self.requests <= self.slow:
            time.sleep(self.delay)  # the server's one thread: later requests wait behind this one too
        return paramiko.OPEN_SUCCEEDED


@pytest.fixture(scope="module")
def host_key():
    return paramiko.RSAKey.generate(1024)


@pytest.fixture
def connect(host_key, monkeypatch):
    monkeypatch.setattr(channels, "retry_pause", lambda tried: 0.05)
    made = []

    def connect(delay: float, slow: int):
        near, far = socket.socketpair()
        server = paramiko.Transport(far)
        server.add_server_key(host_key)
        interface = SlowSessions(delay, slow)
        server.start_server(event=threading.Event(), server=interface)  # negotiates in its own thread
        client = paramiko.Transport(near)
        client.start_client(timeout=10)
        client.auth_none("user")
        made.extend((client, server))
        return client, server

    yield connect
    for transport in made:
        transport.close()


def test_a_channel_that_times_out_is_opened_again_and_the_late_ones_are_closed(connect):
    client, server = connect(delay=1.0, slow=1)
    opener = ChannelOpener(tries=8)
    channel = opener.open(functools.partial(open_session_once, client), 0.3)
    assert channel.active and not channel.closed and opener.retries  # opened on a later try
    # the server's side of every try: each one that timed out was confirmed late, then closed
    sides = [server.accept(5) for _ in range(len(opener.retries) + 1)]
    assert all(side is not None for side in sides)
    late = [side for side in sides if side.get_id() != channel.remote_chanid]
    assert len(late) == len(opener.retries)
    deadline = time.monotonic() + 5
    while not all(side.closed for side in late) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(side.closed for side in late)
    kept = next(side for side in sides if side.get_id() == channel.remote_chanid)
    assert not kept.closed


def test_a_host_that_never_confirms_in_time_fails_after_the_tries_with_how_long_each_was(connect):
    client, _ = connect(delay=3.0, slow=3)
    opener = ChannelOpener(tries=2)
    began = time.monotonic()
    with pytest.raises(ChannelTimeout, match="no channel within 0.2 s, 2 times"):
        opener.open(functools.partial(open_session_once, client), 0.2)
    assert time.monotonic() - began < 2.5 and len(opener.retries) == 1


def test_quick_channels_open_at_once_from_four_threads_with_no_retry(connect):
    client, server = connect(delay=0.0, slow=0)
    opener = ChannelOpener()
    opened = []
    once = functools.partial(open_session_once, client)
    threads = [threading.Thread(target=lambda: opened.append(opener.open(once, 5))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(opened) == 4 and all(c.active for c in opened) and not opener.retries
    assert len({c.get_id() for c in opened}) == 4
