"""When the first node seen failing only lost the rendezvous store, the store's node gets a moment
to say its own end before fsdpctl stops the rest.

The store lives in the first node's torchrun. When that node's own ranks fail, its torchrun closes
the store at once, then copies the failed ranks' output and prints which rank failed, and only then
exits. Every other torchrun's next look at the store fails and ends it, and under load that news can
come first: stopped at that moment, the store's torchrun dies without naming its failed rank, and
the run would be blamed on a node that only lost its store (seen in CI: a rank flooding 14 MB and
exiting 3 was reported as another node's exit 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...rundir.outcome import NODE_LOST_EXIT
from ...rundir.state import NodeState
from ..torchrun import store_gone
from .runs import NodeRun

LOOK_SECONDS = 0.5
"""How long the failed node's last lines may take to arrive before it is judged without them."""
GRACE_SECONDS = 5.0
"""How long the store's node is waited for, from the failure."""
QUIET_SECONDS = 2.0
"""A store's node silent this long is not waited for: its link may be gone (the node timeout judges it)."""


@dataclass
class StoreWait:
    """The wait that follows the first failure, while it may be the store's loss."""

    failed: NodeRun
    host: NodeRun
    began: float
    seen: bool = False
    """The failed node's lines say it lost the store."""

    @classmethod
    def begin(cls, failed: NodeRun, host: Optional[NodeRun], now: float) -> Optional[StoreWait]:
        """A wait when ``failed`` exited (a lost node says nothing more), is not the store's node,
        that node still runs, and ``failed``'s lines say it lost the store or are still arriving;
        None: stop the others at once."""
        if (failed.state != NodeState.FAILED or failed.exit_code == NODE_LOST_EXIT or host is None
                or host is failed or host.state != NodeState.RUNNING):
            return None
        wait = cls(failed, host, now)
        wait.seen = store_gone(line.text for line in failed.tail)
        return wait if wait.seen or failed.streaming else None

    def over(self, now: float) -> bool:
        """Time to stop the others: the failure is not the store's loss after all, or the store's
        node has ended, fallen quiet, or taken ``GRACE_SECONDS``."""
        if not self.seen:
            self.seen = store_gone(line.text for line in self.failed.tail)
            if not self.seen:
                return not self.failed.streaming or now - self.began >= LOOK_SECONDS
        return (now - self.began >= GRACE_SECONDS or self.host.state != NodeState.RUNNING
                or now - self.host.last_heard > QUIET_SECONDS)
