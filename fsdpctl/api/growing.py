"""An elastic run short of nodes grows back: at each checkpoint its ranks say (a ``CHECKPOINT_SAVED``
row of the attempt's, never a printed line), the launcher looks whether its excluded hosts are back
(``hosts --restore``, or its own re-check with ``elastic.recheck``); when they are, it stops the
attempt there and starts the next one on all of them. The watch sits where the hang watchdog does
(the follower asks it what is due and shows it every line) and listens to the run's collector."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional

from ..backends.hang_watch import HangVerdict
from ..node.events import CHECKPOINT_SAVED, event_name
from ..rundir.state import Failure

if TYPE_CHECKING:
    from ..backends.hang_watch import HangWatch
    from ..hostpool.choice import HostChoice
    from ..live.collector import Collector
    from ..rundir.rundir import RunDir
    from .events import Emitter


def short_of_nodes(run: RunDir) -> bool:
    """An elastic run whose attempt runs on fewer nodes than its full size."""
    elastic = run.plan.elastic
    return elastic is not None and elastic.is_short(run.plan.num_nodes)


def hosts_now(run: RunDir) -> Optional[HostChoice]:
    """The run's hosts as a launch would place them now, when there are more of them than this
    attempt has (its excluded hosts restored); None: no more."""
    from ..errors import UsageError
    from ..plan.elastic_policy import grows_back
    from .attempts import hosts_placed_now

    try:
        choice = hosts_placed_now(run)
    except UsageError:
        return None
    return choice if grows_back(run.plan.elastic, nodes=run.plan.num_nodes, placeable=len(choice.hosts)) else None


class GrowWatch:
    """The hang watchdog's interface (``saw_any``, ``due``, ``fire``), with the run's growth beside
    the watchdog it wraps (None: the run has none)."""

    def __init__(self, run: RunDir, emit: Emitter, inner: Optional[HangWatch] = None):
        self.run, self.inner, self.emit = run, inner, emit
        self.recheck = run.plan.elastic is not None and run.plan.elastic.recheck
        self.grow_to: Optional[HostChoice] = None
        """The hosts the next attempt runs on (set at the checkpoint where the attempt is stopped)."""
        self.at_step: Optional[int] = None
        self.fired = False
        self._checking: Optional[threading.Thread] = None

    def around(self, inner: Optional[HangWatch]) -> GrowWatch:
        """This watch in the hang watchdog's place, ``inner`` (None: the run has none) beside it."""
        self.inner = inner
        return self

    def saw(self, line: str) -> None:
        self.saw_any((line,))

    def saw_any(self, lines) -> None:
        """The run's lines: the hang watchdog's (a checkpoint is a row, never a line)."""
        if self.inner is not None:
            self.inner.saw_any(lines)

    def listen(self, collector: Collector) -> None:
        """Take the ranks' event rows from the run's collector (``fsdpctl.live.collector.listen``)."""
        collector.on_events(self.event)

    def event(self, row: dict[str, Any]) -> None:
        """A rank's event row: a checkpoint this attempt saved (the bundled workload's, or a program's
        DCP save) is where the run may grow back."""
        if self.grow_to is not None or event_name(row) != CHECKPOINT_SAVED:
            return
        if row.get("attempt") != self.run.plan.attempt:
            return  # an earlier attempt's, read again
        step = row.get("step")
        self._at_checkpoint(step if isinstance(step, int) and not isinstance(step, bool) else None)

    def due(self) -> Optional[float]:
        if self.grow_to is not None and not self.fired:
            return 0.0
        return self.inner.due() if self.inner is not None else None

    def fire(self, silent: float) -> HangVerdict:
        if self.grow_to is not None and not self.fired:
            self.fired = True
            where = f"the checkpoint of step {self.at_step}" if self.at_step is not None else "a checkpoint"
            detail = (f"stopped at {where} to grow back to {len(self.grow_to.hosts)} of {self.grow_to.full} "
                      f"nodes")
            return HangVerdict(True, Failure(kind="resize", host=None, node_rank=None, exit_code=0, detail=detail))
        assert self.inner is not None
        return self.inner.fire(silent)

    def _at_checkpoint(self, step: Optional[int]) -> None:
        choice = hosts_now(self.run)
        if choice is not None:
            self.grow_to, self.at_step = choice, step
            return
        if self.recheck and (self._checking is None or not self._checking.is_alive()):
            self._checking = threading.Thread(target=self._recheck, name="fsdpctl-elastic-recheck", daemon=True)
            self._checking.start()

    def _recheck(self) -> None:
        """Each excluded host of the run's: restored when it passes its checks (the next checkpoint
        then finds it back)."""
        from ..errors import UsageError
        from ..hostpool.store import read_exclusions
        from .attempts import profile_now
        from .events import Emitter
        from .hosts import restore_host

        profile = profile_now(self.run)
        names = {h.host for h in (*profile.hosts, *profile.spares)}
        for host in [h for h in read_exclusions(profile.name) if h in names]:
            try:
                restore_host(profile, host, Emitter(None), self.run.plan.environment)
            except UsageError:
                continue  # still unfit: looked at again at the next checkpoint
            except Exception as exc:  # noqa: BLE001 - a re-check that cannot run must not end the run
                self.emit.notice(f"elastic: re-checking {host} failed ({exc}); it stays excluded", "warning")
            else:
                self.emit.notice(f"elastic: {host} passed its re-check and is restored; run {self.run.run_id} "
                                 f"grows back at its next checkpoint", "success")
