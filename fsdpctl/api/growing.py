"""An elastic run short of nodes grows back: at each checkpoint its ranks say, the launcher looks
whether its excluded hosts are back (``hosts --restore``, or its own re-check with ``elastic.recheck``);
when they are, it stops the attempt there and starts the next one on all of them. The watch sits
where the hang watchdog does (the follower asks it what is due and shows it every line)."""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Optional

from ..backends.hang_watch import HangVerdict
from ..rundir.state import Failure

if TYPE_CHECKING:
    from ..backends.hang_watch import HangWatch
    from ..hostpool.choice import HostChoice
    from ..rundir.rundir import RunDir
    from .events import Emitter

WORKLOAD_SAVED = re.compile(r"fsdpctl\.workload: checkpoint step=(\d+) saved")
"""The bundled workload's line once a checkpoint is complete (renamed into place)."""
PROGRAM_SAVED = re.compile(r"fsdpctl: checkpoint saved \(torch\.distributed\.checkpoint\.save")
"""The start-up hook's line in rank 0 of a program of yours, after each DCP save."""


def short_of_nodes(run: RunDir) -> bool:
    """An elastic run whose attempt runs on fewer nodes than its full size."""
    elastic = run.plan.elastic
    return bool(elastic) and run.plan.num_nodes < elastic["full_nodes"]


def hosts_now(run: RunDir) -> Optional[HostChoice]:
    """The run's hosts as a launch would place them now, when there are more of them than this
    attempt has (its excluded hosts restored); None: no more."""
    from ..errors import UsageError
    from .attempts import hosts_placed_now

    try:
        choice = hosts_placed_now(run)
    except UsageError:
        return None
    return choice if len(choice.hosts) > run.plan.num_nodes else None


class GrowWatch:
    """The hang watchdog's interface (``saw_any``, ``due``, ``fire``), with the run's growth beside
    the watchdog it wraps (None: the run has none)."""

    def __init__(self, run: RunDir, emit: Emitter, inner: Optional[HangWatch] = None):
        self.run, self.inner, self.emit = run, inner, emit
        self.saved = PROGRAM_SAVED if run.plan.command else WORKLOAD_SAVED
        self.recheck = bool(run.plan.elastic.get("recheck"))
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
        lines = list(lines)
        if self.inner is not None:
            self.inner.saw_any(lines)
        if self.grow_to is not None:
            return
        for line in lines:
            if "checkpoint" in line and (match := self.saved.search(line)) is not None:
                self._at_checkpoint(int(match.group(1)) if match.groups() else None)

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
        from .events import Emitter
        from .hosts import restore_host

        profile = self.run.profile
        names = {h.host for h in (*profile.hosts, *profile.spares)}
        for host in [h for h in read_exclusions(profile.name) if h in names]:
            try:
                restore_host(profile, host, Emitter(None))
            except UsageError:
                continue  # still unfit: looked at again at the next checkpoint
            except Exception as exc:  # noqa: BLE001 - a re-check that cannot run must not end the run
                self.emit.notice(f"elastic: re-checking {host} failed ({exc}); it stays excluded", "warning")
            else:
                self.emit.notice(f"elastic: {host} passed its re-check and is restored; run {self.run.run_id} "
                                 f"grows back at its next checkpoint", "success")
