"""known_hosts, read once per file and looked up by name: what a launcher connecting to a thousand
hosts needs of it.

paramiko reads the whole file into every connection, and its reading checks each line against every
line before it: a file of 1,024 hosts took 1.7 s of CPU per connection, so connecting to the 1,024
hosts it names would take half an hour of one core. Here the file is indexed once (again only when
it changes: ``accept-new`` appends to it), and a connection gets the lines that name its host.
Hashed names (``|1|salt|hash``, OpenSSH's HashKnownHosts) are matched as paramiko and OpenSSH match
them: the name hashed with each entry's salt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
from dataclasses import dataclass, field

_LOCK = threading.Lock()
_APPENDING = threading.Lock()


def known_hosts_name(hostname: str, port: int) -> str:
    """How known_hosts names a host: ``host``, or ``[host]:port`` off port 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


@dataclass
class _Index:
    plain: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # name: [(line number, line)]
    hashed: list[tuple[bytes, bytes, int, str]] = field(default_factory=list)  # (salt, digest, number, line)


_INDEXES: dict[str, tuple[tuple[int, int, int], _Index]] = {}


def _read(path: str) -> _Index:
    index = _Index()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle):
            line = raw.strip()
            if not line or line.startswith(("#", "@")):  # markers: paramiko uses none of those lines either
                continue
            for name in re.split(" |\t", line, maxsplit=1)[0].split(","):
                if not name.startswith("|1|"):
                    index.plain.setdefault(name, []).append((number, line))
                    continue
                try:
                    _, _, salt, digest = name.split("|")
                    index.hashed.append((base64.b64decode(salt), base64.b64decode(digest), number, line))
                except (ValueError, binascii.Error):
                    continue  # not a hash OpenSSH wrote: no name can match it
    return index


def known_lines(path: str, name: str) -> list[str]:
    """The lines of the known_hosts file ``path`` that name ``name`` (as ``known_hosts_name`` writes
    it), in the file's order; none where the file does not exist."""
    try:
        stat = os.stat(path)
    except OSError:
        return []
    version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    with _LOCK:
        cached = _INDEXES.get(path)
        if cached is None or cached[0] != version:
            cached = _INDEXES[path] = (version, _read(path))
    index = cached[1]
    wanted = name.encode()
    found = set(index.plain.get(name, ()))
    found.update((number, line) for salt, digest, number, line in index.hashed
                 if hmac.compare_digest(hmac.new(salt, wanted, hashlib.sha1).digest(), digest))
    return [line for _, line in sorted(found)]


class AcceptNew:
    """paramiko's missing-host-key policy for ``accept-new``: an unknown host's key is appended to
    known_hosts (under a lock: many hosts are connected at once) and the connection goes on."""

    def __init__(self, known_hosts: str, port: int):
        self.known_hosts = known_hosts
        self.port = port

    def missing_host_key(self, client, hostname, key) -> None:  # noqa: D401 - paramiko's hook
        name = known_hosts_name(hostname, self.port)
        with _APPENDING:
            os.makedirs(os.path.dirname(os.path.abspath(self.known_hosts)), exist_ok=True)
            with open(self.known_hosts, "a", encoding="utf-8") as handle:
                handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(name, key.get_name(), key)
