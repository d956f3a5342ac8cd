"""The ``ssh`` backend: the profile's hosts, each reached over its own SSH connection."""

from __future__ import annotations

from .nodes import NodesBackend
from .transport import Transport


class SSHBackend(NodesBackend):
    """Hosts over SSH; the master is ``rendezvous.host`` (default: the first host)."""

    name = "ssh"
    port_check = True

    def open_transports(self) -> list[Transport]:
        from .ssh_transport import SSHTransport  # paramiko only when a profile really needs SSH

        return [SSHTransport(host, self.profile.ssh) for host in self.profile.hosts]

    def default_python(self) -> str:
        return "python3"

    def master(self) -> tuple[int, str]:
        names = [h.host for h in self.profile.hosts]
        rank = names.index(self.profile.rendezvous.host) if self.profile.rendezvous.host else 0
        master = self.profile.hosts[rank]
        return rank, master.address or master.host
