"""Reaching hosts through jump hosts, and not too many handshakes at once with any one sshd.

A ProxyJump chain ``a,user@b:2222`` is followed as OpenSSH follows it; every host behind a jump host
is a channel over one connection to it per process (as OpenSSH's ControlMaster shares one), so 24
hosts behind a bastion cost the bastion one connection, not 24 that its MaxStartups may drop. And a
process opens at most ``HANDSHAKES_PER_SSHD`` connections at once to any one sshd (and
``HANDSHAKES_AT_ONCE`` to all), and tries one that an sshd dropped again after a pause spread at
random (``retry_pause``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

HANDSHAKES_PER_SSHD = 8
"""Connections to one sshd still being set up at once, at most: OpenSSH's default MaxStartups
(10:30:100) starts dropping new ones at random once 10 are unauthenticated."""
HANDSHAKES_AT_ONCE = 64
"""Handshakes under way at once from this process, to all hosts: each costs the launcher 6-7 ms of
CPU (measured at 64 and 256 nodes, docs/performance.md), mostly under the GIL, so 1,024 started at
once take about 7 s to finish together, near the 10 s connect timeout; 64 at a time take 0.45 s each
and as long in all. The wait for a slot is not part of a host's timeout."""
CONNECT_TRIES = 8
"""Tries of a connection that was dropped while it was set up (a busy sshd's MaxStartups), before the
host counts as unreachable: 16 to 47 s of pauses in all (``retry_pause``)."""
RETRY_PAUSE_CAP = 8.0
"""The longest pause between two tries of a dropped connection, before its spread."""


@dataclass(frozen=True)
class Hop:
    """One jump host of a ProxyJump chain: ``[user@]host[:port]``."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return (f"{self.user}@" if self.user else "") + self.host + (f":{self.port}" if self.port else "")


def jump_chain(text: str) -> list[Hop]:
    """OpenSSH's ProxyJump, ``a,user@b:2222``: the hops, the first one reached first. ValueError on a
    hop that is not ``[user@]host[:port]``."""
    hops = []
    for word in text.split(","):
        word = word.strip()
        user, _, rest = word.rpartition("@")
        if rest.startswith("["):  # [v6::addr]:port
            host, _, port = rest[1:].partition("]")
            port = port.lstrip(":")
        else:
            host, _, port = rest.partition(":")
        if not host or (port and not port.isdigit()):
            raise ValueError(f"{word!r} is not [user@]host[:port]")
        hops.append(Hop(host=host, user=user or None, port=int(port) if port else None))
    return hops


class Jumps:
    """One connection per jump host per process, shared by every host behind it (as OpenSSH's
    ControlMaster shares one): each host is a channel over it, so 24 hosts behind a bastion cost the
    bastion one connection, not 24 that its MaxStartups may drop."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[tuple, list] = {}  # key -> [transport, users, its own lock]

    def acquire(self, key: tuple, make: Callable[[], Any]) -> Any:
        with self.lock:
            entry = self.held.get(key)
            if entry is None or (entry[0].client is not None and not _alive(entry[0])):
                entry = self.held[key] = [make(), 0, threading.Lock()]
            entry[1] += 1
        with entry[2]:  # one connect for all who wait on it
            try:
                entry[0].connect()
            except BaseException:
                self.release(key, entry[0])
                raise
        return entry[0]

    def release(self, key: tuple, transport: Any) -> None:
        with self.lock:
            entry = self.held.get(key)
            if entry is None or entry[0] is not transport:
                transport.close()
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self.held[key]
        transport.close()


JUMPS = Jumps()
_HANDSHAKES: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_HANDSHAKES_LOCK = threading.Lock()
_ANY_HANDSHAKES = threading.BoundedSemaphore(HANDSHAKES_AT_ONCE)


def sshd_slots(hostname: str, port: int) -> threading.BoundedSemaphore:
    """The handshakes one sshd may have under way from this process at once."""
    with _HANDSHAKES_LOCK:
        return _HANDSHAKES.setdefault((hostname, port), threading.BoundedSemaphore(HANDSHAKES_PER_SSHD))


@contextmanager
def handshake_slot(hostname: str, port: int) -> Iterator[None]:
    """``with handshake_slot(host, port):`` one handshake, once both that sshd and this process have
    room for it (the sshd's slot first: whoever holds one of the process's slots can go on)."""
    with sshd_slots(hostname, port), _ANY_HANDSHAKES:
        yield


def _alive(transport: Any) -> bool:
    inner = transport.client.get_transport() if transport.client is not None else None
    return inner is not None and inner.is_active()


def retry_pause(dropped: int) -> float:
    """Seconds to wait before trying a connection dropped ``dropped`` times: doubling from 0.5 s up to
    ``RETRY_PAUSE_CAP``, each spread over half to one and a half of itself, so the connections an
    sshd dropped together do not all come back at the same moment (and are dropped together again)."""
    return min(RETRY_PAUSE_CAP, 0.5 * 2 ** (dropped - 1)) * random.uniform(0.5, 1.5)
