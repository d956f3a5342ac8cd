"""What a restart cost the bundled workload: how long the training stood still, the steps it trained
again, and its speed before and after, from the training rows its rank 0 writes (never its printed
step lines), recorded in run.json's ``recovery``."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Optional

from .events import Emitter, Event

if TYPE_CHECKING:
    from ..live.collector import Collector
    from ..rundir.lines import LogLine
    from ..rundir.rundir import RunDir
    from ..rundir.status import Recovery


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class RecoveryClock(Emitter):
    """The emitter it wraps (the follower of each attempt is handed it as its sink), listening to the
    training rows each attempt's collector reads (``listen``).

    The clock is the rows' own. A training row's ``time`` is the wall clock of the node whose rank 0
    wrote it, as the step's window closed; the standstill is the next attempt's first row's time less
    the failed attempt's last row's. The launcher's clock is not mixed in: it sees a row only when its
    copy is read (the agents send every half second, the collector reads every two), which would add
    seconds at either end, and when it noticed the failure is not when the training stopped. Rank 0 on
    the same host in both attempts (a restart on the same nodes) makes the figure exact; a spare in its
    place adds the two hosts' clock skew (milliseconds under NTP). A row no newer than the newest one
    taken is skipped: the copies read again from an earlier point, or a resumed attempt's rewrite of
    its file, bring old rows back (so a host whose clock runs behind the failed one's by more than the
    standstill has its first rows skipped until it catches up).
    """

    AFTER_ROWS = 3
    """The training row after a restart whose speed counts as the speed after it (the first is warm-up)."""

    def __init__(self, inner: Emitter):
        super().__init__(None)
        self.inner = inner
        self.last_step: Optional[int] = None
        self.last_at: Optional[float] = None
        self.tok_s: Optional[float] = None
        self.waiting: Optional[tuple[RunDir, Optional[int]]] = None
        """The next attempt's run and the step it resumed from, until its first training row is in."""
        self.after: Optional[tuple[RunDir, Recovery]] = None
        """The recovery recorded, until its speed after is in."""
        self._rows_after = 0

    def __call__(self, event: Event) -> None:
        self.inner(event)

    def lines(self, batch: list[LogLine]) -> None:
        self.inner.lines(batch)

    def flush(self) -> None:
        self.inner.flush()

    def listen(self, collector: Collector) -> None:
        """Take the training rows of the attempt ``collector`` reads (``fsdpctl.live.collector.listen``),
        and hand the collector to the emitter it wraps (a ``Notifier`` listens too)."""
        collector.on_rows(self.row)
        hear = getattr(self.inner, "listen", None)
        if callable(hear):
            hear(collector)

    def restarted(self, run: RunDir, from_step: Optional[int]) -> None:
        """The next attempt (``run``) started from ``from_step``: its first training row records the
        recovery (nothing when no training row of the failed attempt came)."""
        self.waiting = (run, from_step) if self.last_at is not None else None
        self.after = None

    def row(self, kind: str, row: dict[str, Any]) -> None:
        """A row the copies brought (``train`` or ``val``)."""
        step, at = row.get("step"), _number(row.get("time"))
        if kind != "train" or not isinstance(step, int) or at is None:
            return
        if self.last_at is not None and at <= self.last_at:
            return  # an old row read again (see the class)
        tok_s = _number(row.get("tokens_per_s"))
        if self.waiting is not None:
            (run, from_step), self.waiting = self.waiting, None
            self._recovered(run, from_step, at)
        elif self.after is not None and tok_s is not None:
            self._rows_after += 1
            if self._rows_after >= self.AFTER_ROWS:
                (run, recovery), self.after = self.after, None
                run.change(recovery=dataclasses.replace(recovery, tok_s_after=tok_s))
        self.last_step, self.last_at = step, at
        self.tok_s = tok_s if tok_s is not None else self.tok_s

    def _recovered(self, run: RunDir, from_step: Optional[int], at: float) -> None:
        """The next attempt's first training row is in: record how long the training stood still since
        the failed attempt's last one, how many steps it trains again and its speed before; its speed
        after once a few more rows are in."""
        from ..rundir.status import Recovery

        assert self.last_at is not None
        redone = self.last_step - from_step if self.last_step is not None and from_step is not None else None
        recovery = Recovery(stood_still_s=at - self.last_at, steps_redone=redone, tok_s_before=self.tok_s)
        run.change(recovery=recovery)
        self.after, self._rows_after = ((run, recovery), 0) if self.tok_s is not None else (None, 0)
