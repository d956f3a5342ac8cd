"""The ``local`` backend: the one node is this machine, reached through bash, no SSH."""

from __future__ import annotations

from ...plan.types import NodeTarget, Overrides, Placement, PlanContext
from ...profiles.schema import ClusterProfile
from ...shell import join_path
from ..base import ProfileProblem, TraceNode
from ..nodes.backend import NodesBackend, pyxis_problem
from ..transport import LocalTransport, Transport

__all__ = ["LocalBackend"]


class LocalBackend(NodesBackend):
    """This machine as the only node."""

    name = "local"
    takes_spares = False  # one node, this machine
    port_check = False  # one node: nobody else needs to reach the rendezvous port

    @classmethod
    def check_profile(cls, profile: ClusterProfile) -> ProfileProblem | None:
        if len(profile.hosts) > 1:
            return "hosts", "a local profile runs on this machine only", "use backend: ssh for several hosts"
        return pyxis_problem(profile)

    @classmethod
    def placement(cls, profile: ClusterProfile, overrides: Overrides, context: PlanContext) -> Placement:
        """This machine, with the Python running fsdpctl (which has the workload's packages) and a
        relative workdir anchored where fsdpctl runs; torchrun picks a free port itself."""
        workdir = profile.workdir
        host = profile.hosts[0] if profile.hosts else None  # its GPUs and processes, when the profile says
        own = {"gpus": host.gpu_count, "nproc": host.nproc, "chosen_gpus": host.chosen_gpus} if host else {}
        if not workdir.startswith(("/", "~")):
            workdir = join_path(context.local_cwd, workdir)
        return Placement(backend=cls.name, num_nodes=1, master_host="localhost", master_addr="127.0.0.1",
                         python=profile.python or context.local_python, workdir=workdir, rdzv_backend="standalone",
                         nodes=(NodeTarget(host="localhost", address="127.0.0.1", **own),))

    @classmethod
    def layout(cls, profile: ClusterProfile) -> tuple[int | None, int | None]:
        return 1, None

    def open_connection(self, host: str) -> Transport:
        return LocalTransport()

    def count_gpus(self) -> int | None:
        """This machine's GPUs, counted as the probe counts a node's (the driver's list, the device
        files, nvidia-smi where it answers): the node is this machine."""
        from ...hostcheck.probe_script import gpus

        return int(gpus()["count"])

    def trace_node(self) -> TraceNode | None:
        node = super().trace_node()
        return TraceNode("this machine", node.transport, node.python) if node is not None else None
