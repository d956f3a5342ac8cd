"""The transports of a profile's nodes: this machine for ``local``, SSH for ``ssh``."""

from __future__ import annotations

import sys

from ..profiles.schema import ClusterProfile
from .transport import Transport


def open_transports(profile: ClusterProfile) -> list[Transport]:
    """One transport per node, in node-rank order (connections open lazily, on first use)."""
    if profile.backend == "local":
        from .transport import LocalTransport

        return [LocalTransport()]
    from .ssh_transport import SSHTransport  # paramiko only when a profile really needs SSH

    return [SSHTransport(host, profile.ssh) for host in profile.hosts]


def node_python(profile: ClusterProfile) -> str:
    """The interpreter the probe and the workload run with on the nodes."""
    return profile.python or (sys.executable if profile.backend == "local" else "python3")


def master_of(profile: ClusterProfile) -> tuple[int, str]:
    """The master's node rank and the address the other nodes reach it at."""
    if profile.backend == "local":
        return 0, "127.0.0.1"
    names = [h.host for h in profile.hosts]
    rank = names.index(profile.rendezvous.host) if profile.rendezvous.host else 0
    master = profile.hosts[rank]
    return rank, master.address or master.host


def close_all(transports: list[Transport]) -> None:
    for transport in transports:
        transport.close()
