"""A detached run's follower: the process ``launch --detach`` (and ``submit`` without ``--follow``)
leaves on this machine (``detached.spawn_follower``). It follows the run to its end as its collector
(the logs, the nodes' metrics and GPU samples brought here, how each node stands said every second,
the exports), acts on a hang as anyone following an ownerless run does, records how the run ended,
and leaves. While the run's restarts last it starts the next attempt after a failure as a launcher
that follows its run does: on healthy hosts, a spare in a lost node's place, an elastic run shrunk or
grown back (each attempt detached too). The run does not depend on it: killed, it only stops the
copies here (a viewer then says the data stops) and the restarts. What it saw happen goes to
``live/follower.log``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from .detached import LOG


class FollowerLog:
    """The follower's events as lines of its log (the run's own lines are in its logs already)."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, event: Any) -> None:
        from .events import AttemptStarting, Notice, PreflightStarted, RunEnded, RunStarted

        if isinstance(event, Notice):
            self.write(event.text)
        elif isinstance(event, AttemptStarting):
            where = f" from step {event.from_step}" if event.from_step is not None else ""
            self.write(f"attempt {event.attempt} of {event.last_attempt}{where} after {event.after}")
        elif isinstance(event, PreflightStarted):
            self.write(f"{'re-check: ' if event.recheck else ''}preflight of {event.nodes} node(s)")
        elif isinstance(event, RunStarted):
            self.write(f"run {event.run_id} attempt {event.attempt} {event.how}")
        elif isinstance(event, RunEnded):
            self.write(f"run {event.run_id} {event.outcome.state} (exit {event.outcome.exit_code})")

    def lines(self, batch: list[Any]) -> None:
        return None

    def write(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")


def follow_in_background(root: Path) -> int:
    """Follow the run in ``root`` to its end as its collector; the exit status of this process."""
    from ..backends import backend_for_run
    from ..live.layout import live_dir
    from ..rundir.rundir import load_run
    from .events import Emitter
    from .following import follow_from_outside
    from .restarting import follow_with_restarts

    run = load_run(root)
    log = FollowerLog(live_dir(root) / LOG)
    log.write(f"following run {run.run_id} (pid {os.getpid()})")
    backend = backend_for_run(run)
    emit, notifier = Emitter(log), _notifier(run, log)
    try:
        if notifier is not None:
            notifier.attempt_started(run, "detached; followed in the background")
        if restarts_here(backend, run):  # the run's owner now (owner_lock): viewers follow it and leave it be
            follow_with_restarts(backend, run, backend.attach(run, collect=True), notifier or emit, signals=False,
                                 detached=True)
        else:
            follow_from_outside(backend, run, notifier or emit, signals=False, collect=True)
    finally:
        backend.close()
        if notifier is not None:
            notifier.close()
    return 0


def restarts_here(backend, run) -> bool:
    """This follower starts the run again after a failure: it may restart (``max_restarts``) or
    change size (``elastic``), and no scheduler does that in its place (Slurm requeues its job)."""
    from .restarting import may_start_again

    return not backend.queued and may_start_again(run.plan)


def _notifier(run, log: FollowerLog):
    """The notices of the profile's ``notify`` section, the secret URLs from the environment the
    launcher left this process; None without one (or, said in the log, when its targets fail)."""
    from ..errors import FsdpctlError
    from .events import Emitter
    from .notifying import notifier_for, notify_spec_of

    try:
        return notifier_for(notify_spec_of(run), Emitter(log), run)
    except FsdpctlError as exc:
        log.write(f"no notices: {exc.message}")
        return None


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(follow_in_background(Path(sys.argv[1])))
