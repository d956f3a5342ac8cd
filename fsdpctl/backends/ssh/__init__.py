"""The ``ssh`` backend: the profile's hosts, each reached over its own SSH connection."""

from __future__ import annotations

from ...errors import UsageError
from ...plan.make import is_ip
from ...plan.types import NodeTarget, Overrides, Placement, PlanContext
from ...profiles.schema import ClusterProfile, HostSpec
from ..base import ProfileProblem
from ..nodes.backend import NodesBackend, pyxis_problem
from ..transport import Transport

__all__ = ["SSHBackend"]


class SSHBackend(NodesBackend):
    """Hosts over SSH; the master is ``rendezvous.host`` (default: the first host)."""

    name = "ssh"
    port_check = True

    @classmethod
    def check_profile(cls, profile: ClusterProfile) -> ProfileProblem | None:
        if not profile.hosts:
            return "hosts", "an ssh profile needs at least one host", "list the nodes under hosts:"
        return pyxis_problem(profile)

    @classmethod
    def placement(cls, profile: ClusterProfile, overrides: Overrides, context: PlanContext) -> Placement:
        """The profile's hosts in node-rank order (under static rendezvous the rendezvous host
        first); an IP given as the host is also where the others reach it, and torchrun binds to it."""
        if not profile.hosts:
            raise UsageError(f"profile {profile.name}: has no hosts", "list the nodes under hosts:")
        nodes = tuple(NodeTarget(host=h.host, address=h.address or h.host,
                                 bind=h.address or (h.host if is_ip(h.host) else None), gpus=h.gpu_count,
                                 interface=h.interface, nproc=h.nproc, chosen_gpus=h.chosen_gpus)
                      for h in profile.hosts)
        master = next((n for n in nodes if n.host == profile.rendezvous.host), nodes[0])
        if profile.rendezvous.backend == "static" and master is not nodes[0]:
            # Static rendezvous: node rank 0 serves the store at --master-addr, so the rendezvous
            # host must be node rank 0 (elsewhere every rank waits on a store nobody serves).
            nodes = (master, *(n for n in nodes if n is not master))
        warnings = () if is_ip(master.address) else (
            f"rendezvous address {master.address!r} is a host name: every node must resolve it the same way; "
            f"give hosts[].address an IP to be sure",)
        return Placement(backend=cls.name, num_nodes=len(nodes), master_host=master.host, master_addr=master.address,
                         python=profile.python or "python3", workdir=profile.workdir, nodes=nodes, warnings=warnings)

    def open_connection(self, host: str) -> Transport:
        from .transport import SSHTransport  # paramiko only when a profile really needs SSH

        spec = next((h for h in (*self.profile.hosts, *self.profile.spares) if h.host == host), HostSpec(host=host))
        return SSHTransport(spec, self.profile.ssh)

    def address_of(self, host: str) -> str:
        """As the base does, with ``~/.ssh/config``'s HostName for an alias."""
        from .transport import resolve_target

        return super().address_of(host if is_ip(host) else resolve_target(host, self.profile.ssh).hostname)
