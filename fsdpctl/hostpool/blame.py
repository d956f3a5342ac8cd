"""Which node a failed attempt is to blame on, and which hosts a check found unfit (pure).

The rule (docs/guides/restarts-and-spares.md says it to users): a node is to blame
when it was lost (nothing heard from it for the node timeout, before any other node failed), when
its GPU watcher said a hardware fault during the attempt (a new uncorrectable ECC error, a pending
row remap, a hardware XID: the CUDA error the ranks then raise looks like a program's own), when
its ranks died by a signal the other nodes' ranks did not get (a SIGKILL, SIGBUS, SIGSEGV... there
alone, not fsdpctl's own stop), or when it fails the re-check before the next attempt. A program's
own error (an exception or an exit code, on one rank or on all of them, on a node that answers and
passes its checks) blames no node: the run restarts on the same hosts, or ends as it would have.
"""

from __future__ import annotations

import signal as _signal
from collections.abc import Mapping, Sequence
from typing import Optional

from ..hostcheck.checks import Check, DoctorReport
from ..rundir.state import NodeState, signal_name
from ..rundir.status import NodeStatus

_OUR_STOP = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)


def nodes_to_blame(nodes: Sequence[NodeStatus], faults: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """The hosts of an attempt's nodes that are to blame for its failure, with why (host -> why);
    ``faults``: the hardware faults their GPU watchers said during the attempt (host -> what)."""
    blamed: dict[str, str] = {host: f"hardware fault during the run: {what}" for host, what in (faults or {}).items()}
    for node in nodes:
        # One that went quiet while fsdpctl was stopping it, after another node had failed, is not
        # held to it: a loaded launcher or node can miss heartbeats during a teardown.
        if node.state is NodeState.LOST and not node.stopped:
            blamed[node.host] = f"lost: {node.detail}" if node.detail else "lost: it stopped answering"
    signalled = [n for n in nodes if n.state is NodeState.FAILED and n.signal and not n.stopped
                 and n.signal not in _OUR_STOP]
    for node in signalled:
        if not any(n is not node and n.signal == node.signal and not n.stopped for n in nodes):
            blamed.setdefault(node.host, f"its ranks died by {signal_name(node.signal) or node.signal}, "
                                         f"which no other node's got")
    return blamed


def _reaching_the_master(check: Check) -> bool:
    return check.name == "port" and check.detail.startswith("cannot reach the master")


def unfit_hosts(report: DoctorReport, trusted: Sequence[str] = ()) -> dict[str, str]:
    """The hosts a check failed on, with the first failure (host -> why). A fact that differs between
    hosts (torch, NCCL, Python...) is held against the hosts that differ from the ``trusted`` ones
    (those the run already ran on), else from the most of them."""
    unfit: dict[str, str] = {}
    victims = set()
    for host in report.hosts:
        failed = [c for c in host.checks if c.status == "fail"]
        if failed:
            unfit[host.host] = f"{failed[0].name}: {failed[0].detail}"
            if all(_reaching_the_master(c) for c in failed):
                victims.add(host.host)
    if any(host not in victims for host in unfit):
        # Hosts that only could not reach the master, beside a host that failed on its own (the master
        # gone, say): the fault is that host's, theirs is its consequence.
        unfit = {host: why for host, why in unfit.items() if host not in victims}
    for entry in report.parity:
        if entry.status != "fail":
            continue
        reference = [v for h, v in entry.values.items() if h in trusted]
        if reference:
            expected = reference[0]
        else:
            counts: dict[object, int] = {}
            for value in entry.values.values():
                counts[value] = counts.get(value, 0) + 1
            expected = max(counts, key=lambda v: counts[v])
        for host, value in entry.values.items():
            if value != expected:
                unfit.setdefault(host, f"{entry.fact} {value} where the others have {expected}")
    return unfit
