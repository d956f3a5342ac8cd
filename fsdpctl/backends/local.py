"""The ``local`` backend: the one node is this machine, reached through bash, no SSH."""

from __future__ import annotations

import sys

from .nodes import NodesBackend
from .transport import LocalTransport, Transport


class LocalBackend(NodesBackend):
    """This machine as the only node."""

    name = "local"
    port_check = False  # one node: nobody else needs to reach the rendezvous port

    def open_transports(self) -> list[Transport]:
        return [LocalTransport()]

    def default_python(self) -> str:
        return sys.executable  # the Python running fsdpctl, which has the workload's packages

    def master(self) -> tuple[int, str]:
        return 0, "127.0.0.1"
