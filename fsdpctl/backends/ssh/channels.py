"""Session channels on one node's connection: opened again when the node is slow to confirm one,
read as a stream, and written to without paramiko's quadratic copy. Free of paramiko itself (the
transport module is its home): a channel here is anything with paramiko's channel methods.

A channel whose confirmation does not come within the timeout is not always a dead host. At 256 nodes
the launcher's two cores were busy with the first nodes' logs while the last ones started, and a
node's sshd had confirmed the channel 10 s before the launcher's paramiko thread read it. So a
channel that times out is opened again after a pause (``retry_pause``), up to ``CHANNEL_TRIES``
times; a host that is really gone fails each try within the timeout. The transport closes the
channel that timed out if its confirmation comes late.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..transport import read_lines
from .jumps import retry_pause

CHANNEL_TRIES = 3
"""Tries of a channel open that timed out, before the host counts as not answering."""
SEND_CHUNK = 1 << 16  # at least one packet's worth (paramiko's largest is 32 KiB)

Channel = TypeVar("Channel")


class OpenTimedOut(Exception):
    """One try to open a channel timed out (raised by the transport's single try)."""


class ChannelTimeout(Exception):
    """Every try to open a channel timed out: ``tries`` of ``timeout`` seconds each."""

    def __init__(self, tries: int, timeout: float):
        super().__init__(f"no channel within {timeout:g} s, {tries} times")
        self.tries, self.timeout = tries, timeout


class ChannelOpener:
    """Opens one connection's channels one at a time (so a channel left pending by a timeout is known
    to be the one that timed out); ``retries`` holds when each try after a timeout began."""

    def __init__(self, tries: int = CHANNEL_TRIES):
        self.tries = tries
        self.retries: list[float] = []
        self.lock = threading.Lock()

    def open(self, open_once: Callable[[float], Channel], timeout: float) -> Channel:
        """``open_once(timeout)`` (it raises OpenTimedOut) tried up to ``tries`` times, under the
        lock; ChannelTimeout when every try timed out. Its other errors are raised as they are."""
        for tried in range(1, self.tries + 1):
            try:
                with self.lock:
                    return open_once(timeout)
            except OpenTimedOut:
                if tried == self.tries:
                    break
                time.sleep(retry_pause(tried))
                self.retries.append(time.time())
        raise ChannelTimeout(self.tries, timeout)


class ChannelStream:
    """One exec channel's output, line by line or in chunks."""

    def __init__(self, channel: Any):
        self.channel = channel

    def lines(self):
        with self.channel.makefile("rb") as output:
            yield from read_lines(output)

    def chunks(self, idle_timeout: float | None = None):
        self.channel.settimeout(idle_timeout)  # socket.timeout (an OSError) after that long without output
        yield from iter(lambda: self.channel.recv(65536), b"")

    def close(self) -> None:
        self.channel.close()


def send_all(channel: Any, data: bytes) -> None:
    """Send ``data`` through the channel. paramiko's own sendall copies what is left after every
    packet (``s = s[sent:]``): quadratic, 50 MB took 9-12 s here. This copies one packet at a time."""
    view, offset = memoryview(data), 0
    while offset < len(view):
        offset += channel.send(bytes(view[offset:offset + SEND_CHUNK]))
