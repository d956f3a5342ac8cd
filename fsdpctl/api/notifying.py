"""Notices to people of a run's events (a profile's ``notify`` section), sent by whoever follows the run.

Where the events come from: a ``Notifier`` is an ``Emitter`` wrapped around the follower's own (as
``RecoveryClock`` is), so it hears what the API already says, in order: ``RunStarted`` (started; after
an ``AttemptStarting``: restarted, shrunk or grown, by the attempt's node count), ``RunEnded`` (failed
with the first failure, or finished with its figures) and ``HangSuspected`` (hang). The run's collector
hands it the training rows (``listen``): an attempt's first step, and the bundled workload's straggler
verdict. One path serves a foreground ``launch`` (and ``submit --follow``, ``Run.resume``), whose
emitter it wraps, and the follower process of a detached or submitted run (``background``), which
says ``started`` itself as it begins. Nothing reads the run's files on a timer for it.

Sending is ``fsdpctl.notify.sender``'s (a thread and a bounded queue per target): a notice never
holds the run up, and a send given up is noted once in run.json's ``notes``. Secret URLs are read
from this process's environment; a detached run's follower inherits that environment.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..notify.message import Message, message
from .events import AttemptStarting, Emitter, Event, HangSuspected, RunEnded, RunStarted

if TYPE_CHECKING:
    from ..live.collector import Collector
    from ..profiles.loader import LoadedProfile
    from ..profiles.notify_spec import NotifySpec
    from ..rundir.lines import LogLine
    from ..rundir.rundir import RunDir
    from ..rundir.state import Outcome

OLD_ROW_SECONDS = 1.0
"""A training row older than its attempt's start by more than this is an earlier attempt's, read again."""


class Notifier(Emitter):
    """The emitter it wraps, every event passed on first; the events the profile's ``notify.events``
    names sent as notices (``put``, never blocking). ``close`` when the following is over."""

    def __init__(self, inner: Emitter, spec: NotifySpec, targets: list, run: Optional[RunDir] = None):
        from ..notify.sender import Sender

        super().__init__(None)
        self.inner, self.events = inner, frozenset(spec.events)
        self.sender = Sender(targets, timeout=spec.timeout, on_given_up=self.note)
        self.run = run
        self.nodes: Optional[int] = run.plan.num_nodes if run is not None else None
        self.restart: Optional[AttemptStarting] = None
        self.began = time.time()
        self.stepped = False
        self.last_row: Optional[Mapping[str, Any]] = None
        self.stragglers: set[tuple[int, Any]] = set()
        self._notes = threading.Lock()
        self._failed_once = False

    # ---- an Emitter ------------------------------------------------------------------------------
    def __call__(self, event: Event) -> None:
        self.inner(event)
        self._guarded(self._heard, event)

    def lines(self, batch: list[LogLine]) -> None:
        self.inner.lines(batch)

    def flush(self) -> None:
        self.inner.flush()

    def listen(self, collector: Collector) -> None:
        """Take the training rows of the attempt ``collector`` reads (``fsdpctl.live.collector.listen``)."""
        collector.on_rows(lambda kind, row: self._guarded(self.row, kind, row))

    def _guarded(self, action, *args: Any) -> None:
        """A notice of ours never fails the run: a bug here is noted once, and the run goes on."""
        try:
            action(*args)
        except Exception as exc:  # noqa: BLE001 - the run must not hear of it
            if not self._failed_once:
                self._failed_once = True
                self.note("notify", f"notify: a notice could not be made: {type(exc).__name__}: {exc}")

    # ---- the run's events ------------------------------------------------------------------------
    def _heard(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            from ..rundir.rundir import load_run

            self.attempt_started(load_run(Path(event.run_dir)), event.how)
        elif isinstance(event, AttemptStarting):
            self.restart = event
        elif isinstance(event, RunEnded) and not event.outcome.left:
            self.ended(event.outcome)
        elif isinstance(event, HangSuspected):
            self.send("hang", "may hang", {"silent": f"{event.silent_s:.0f} s without progress",
                                           "stacks": event.odd, "action": "ending it" if event.stopping
                                           else "left running (on_hang: keep, or another process acts)"},
                      "warning")

    def attempt_started(self, run: RunDir, how: str = "") -> None:
        """An attempt of ``run`` began: started, or (after ``AttemptStarting``) restarted, shrunk or grown."""
        from ..rundir.record import epoch

        before, self.nodes = self.nodes, run.plan.num_nodes
        self.run, self.stepped, self.last_row = run, False, None
        self.began = epoch(run.record.started_at) or time.time()
        restart, self.restart = self.restart, None
        if restart is None:
            self.send("started", f"started (attempt {run.plan.attempt})", {"how": how})
            return
        nodes = run.plan.num_nodes
        kind = "restarted" if before in (None, nodes) else "shrunk" if nodes < before else "grown"
        headline = {"restarted": f"restarted: attempt {restart.attempt} of {restart.last_attempt}",
                    "shrunk": f"shrunk to {nodes} nodes: attempt {restart.attempt}",
                    "grown": f"grown to {nodes} nodes: attempt {restart.attempt}"}[kind]
        self.send(kind, headline, {"after": restart.after, "from_step": restart.from_step,
                                   "nodes": f"{before} -> {nodes}" if kind != "restarted" else nodes}, "warning")

    def ended(self, outcome: Outcome) -> None:
        """An attempt ended: failed (with its first failure) or finished (with its figures)."""
        if outcome.state.is_failure:
            failure = outcome.first_failure
            self.send("failed", f"failed (attempt {self.run.plan.attempt if self.run else '?'})", {
                "first_failure": failure.describe() if failure else None,
                "error": failure.error if failure else None, "exit_code": outcome.exit_code,
                "message": outcome.message}, "failure")
            return
        self.send("finished", f"{outcome.state} (exit {outcome.exit_code})", {**self.figures(),
                  "message": outcome.message}, "success" if outcome.ok else "info")

    def figures(self) -> dict[str, Any]:
        """What the finished run did: its last logged step, loss and speed, attempts and duration."""
        from ..rundir.record import epoch

        row = self.last_row or {}
        record = self.run.record if self.run is not None else None
        began = epoch(record.created_at) if record is not None else None
        return {"steps": row.get("step"), "loss": _rounded(row.get("loss"), 4),
                "tokens_per_s": _rounded(row.get("tokens_per_s"), 0),
                "attempts": record.attempt if record is not None else None,
                "duration": f"{time.time() - began:.0f} s" if began is not None else None}

    def row(self, kind: str, row: dict[str, Any]) -> None:
        """A training row the copies brought: an attempt's first step; a straggler the workload names."""
        at, step = row.get("time"), row.get("step")
        if kind != "train" or not isinstance(step, int):
            return
        if isinstance(at, (int, float)) and at < self.began - OLD_ROW_SECONDS:
            return
        self.last_row = row
        if not self.stepped:
            self.stepped = True
            self.send("first_step", f"made its first step ({step})", {
                "step": step, "loss": _rounded(row.get("loss"), 4),
                "tokens_per_s": _rounded(row.get("tokens_per_s"), 0)})
        where = row.get("straggler_at") or {}
        if row.get("straggler") and isinstance(where, Mapping):
            key = (self.run.plan.attempt if self.run else 0, where.get("rank"))
            if key not in self.stragglers:
                self.stragglers.add(key)
                self.send("straggler", f"has a straggler: rank {where.get('rank')} on {where.get('host')}", {
                    "straggler": row.get("straggler"), "rank": where.get("rank"), "node": where.get("node"),
                    "host": where.get("host"), "step": step}, "warning")

    # ---- sending ---------------------------------------------------------------------------------
    def send(self, event: str, headline: str, facts: Mapping[str, Any], level: str = "info") -> None:
        """Queue the notice of ``event`` when the profile asks for it, with the run's own facts."""
        if event not in self.events:
            return
        run = self.run
        common: dict[str, Any] = {}
        if run is not None:
            common = {"profile": run.plan.profile_name, "attempt": run.plan.attempt,
                      "hosts": ", ".join(node.host for node in run.plan.nodes), "run_dir": str(run.root)}
        self.sender.put(message(event, run.run_id if run else "?", headline, {**facts, **common}, level))

    def note(self, target: str, text: str) -> None:
        """A notice given up: once per target, in run.json's ``notes`` (never raised)."""
        run = self.run
        if run is None:
            return
        with self._notes:
            run.change(notes=(*run.record.notes, text))

    def close(self) -> None:
        """The following is over: the last notices go within a few seconds, or are let go."""
        self.sender.close()


def _rounded(value: Any, digits: int) -> Any:
    """A figure as a person reads it (a row's float has 16 digits); anything else as it is."""
    if isinstance(value, float):
        return round(value) if digits == 0 else round(value, digits)
    return value


def notifier_for(spec: Optional[NotifySpec], inner: Emitter, run: Optional[RunDir] = None, *,
                 send: bool = True) -> Optional[Notifier]:
    """A Notifier around ``inner`` for the profile's ``notify`` section (None: it has none, or
    ``send`` is off). Its targets are checked first, either way: a secret not set, apprise missing or
    a URL it cannot send to is a UsageError, in one line."""
    if spec is None:
        return None
    from ..notify.targets import check_targets

    targets = check_targets(spec)
    return Notifier(inner, spec, targets, run) if send else None


def notify_spec_of(run: RunDir) -> Optional[NotifySpec]:
    """The run's ``notify`` section: its job file's (kept in inputs.json), else its profile's."""
    from ..profiles.notify_spec import NotifySpec
    from ..rundir.paths import read_json
    from ..rundir.rundir import INPUTS

    given = (read_json(run.root / INPUTS) or {}).get("notify")
    if not isinstance(given, dict):
        return run.profile.notify
    return NotifySpec(**{name: tuple(value) if isinstance(value, list) else value for name, value in given.items()})


def send_test(profile: str | LoadedProfile) -> list[tuple[str, Optional[str]]]:
    """``fsdpctl notify --test``: one test notice to every target of the profile's ``notify``,
    sent now, once each (no retries); per target, its name and None when it went, else why not."""
    from ..errors import UsageError
    from ..notify.targets import SendFailed, check_targets
    from .prepare import load_profile

    loaded = load_profile(profile)
    spec = loaded.profile.notify
    if spec is None:
        raise UsageError(f"profile {loaded.name}: has no notify section",
                         "add notify: with urls, secrets or a command (see docs/profiles.md)")
    notice: Message = dataclasses.replace(message("test", "test", "test notice", {
        "profile": loaded.name, "sent_from": socket.gethostname(), "events": ", ".join(spec.events)}),
        title=f"fsdpctl: test notice (profile {loaded.name})")
    answers: list[tuple[str, Optional[str]]] = []
    for target in check_targets(spec):
        try:
            target.send(notice, spec.timeout)
            answers.append((target.name, None))
        except SendFailed as exc:
            answers.append((target.name, str(exc) or "failed"))
    return answers

