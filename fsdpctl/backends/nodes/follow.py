"""Following a run of fsdpctl's own nodes to its end, as its owner or from outside.

The follower ``start`` returns owns the run: it listens to the node agents it started (when the run
is in the foreground), keeps the local logs, ends the run when interrupted, collects torchrun's log
folders and records how the run ended. One from ``attach`` reads the nodes' files (``tail -F``) and
only follows; it records the end of a detached run that nobody else has settled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ...live.collector import Collector, listen, with_export_notes
from ...live.exports import LiveExports
from ...live.layout import collector_lock, ownerless
from ...node.mask import Masker
from ...plan.types import NodeSpec
from ...rundir.record import epoch, now
from ...rundir.rundir import RunDir
from ...rundir.state import NodeState, Outcome, RunState
from ...rundir.timeline import Timeline
from ..base import LineSink
from ..hang_watch import HangWatch
from ..torchrun import in_shutdown
from ..transport import Transport
from .commands import side_files_command
from .feeds import AgentFeed, TailFeed
from .log_copy import complete_logs
from .runs import EndFetch, NodeRun, RunResult, node_records, read_error_file, read_node_text, recorded_node_runs
from .supervisor import Supervisor


class NodesFollower:
    """Follows one run of a ``NodesBackend``: ``started`` (the nodes this process started) makes it the
    owner; ``connect`` is the backend's own connection to a node."""

    def __init__(self, run: RunDir, started: Optional[list[NodeRun]], how: str,
                 connect: Callable[[NodeSpec], Transport], collect: bool = False):
        self.run, self.how, self.connect = run, how, connect
        self.owner = started is not None
        self.started = started or []
        self.collect = collect or self.owner
        self.fetch: Optional[EndFetch] = None  # the owner's copies of the nodes' files, begun as each ended
        self.node_runs: list[NodeRun] = []
        self.acting = self.owner
        """It acts for the run: its owner, or any follower of a detached run nobody owns (``_follow``)."""
        self.collecting = False
        """This follower is the run's collector (its owner always is; a detached run's follower too):
        it keeps the logs here and the copies of the nodes' side files, unless another process
        already collects the run."""

    def follow(self, sink: LineSink, *, watch: HangWatch | None = None, signals: bool = False,
               leave: threading.Event | None = None) -> Outcome:
        """Stream every node until the run ends, failing fast."""
        run = self.run
        with collector_lock(run.root) if self.collect else contextlib.nullcontext(False) as got:
            collector = None
            if self.collect and got:
                collector = Collector(run.root, run.plan, run.plan.attempt, run.record.from_step,
                                      exports=LiveExports(run))
                listen(collector, sink, watch)  # the ranks' rows to who asks (not their printed lines)
            outcome = self._follow(sink, collector, watch=watch, signals=signals, leave=leave)
            return with_export_notes(outcome, collector)

    def _follow(self, sink: LineSink, collector: Optional[Collector], *, watch: HangWatch | None, signals: bool,
                leave: threading.Event | None) -> Outcome:
        run, plan, owner = self.run, self.run.plan, self.owner
        self.collecting = collector is not None
        watched = owner and all(r.session is not None for r in self.started)
        node_runs = self.started if watched else recorded_node_runs(run, self.connect)
        # A collecting follower goes on from where the copies here end (an earlier one may have begun them).
        # Who acts for the run (its owner; anyone for a detached run nobody owns) finds a silent node lost
        # and ends the others when one fails, as a launcher does; anyone else only reports.
        acting = self.acting = owner or ownerless(run.root, run.record.detached)
        feed = AgentFeed(plan.node_timeout) if watched else TailFeed(
            self._side_command(collector),
            (lambda node: _size(run.paths.logs / f"node{node.rank}.log")) if collector is not None else None,
            node_timeout=float(plan.node_timeout) if acting else None)
        # The values are in this environment (they were read from it at launch; a follower in another
        # shell may have them too); the nodes mask their logs themselves as well.
        masker = Masker([os.environ.get(name, "") for name in plan.secrets])
        # The owner copies each node's torchrun logs here as that node ends (a run directory of this
        # machine's own has them in place already).
        here = Path(plan.run_dir).expanduser().resolve() == run.root.resolve()
        fetch = EndFetch(plan, run.root, masker.bytes if masker else None) if owner and not here else None
        self.fetch, self.node_runs = fetch, node_runs
        result = Supervisor(plan, node_runs, run.paths.logs, sink, feed, grace=plan.stop_grace,
                            write_local=owner or collector is not None,
                            stop_on_interrupt=owner, fail_fast=acting, mask=masker.text if masker else None,
                            watch=watch, signals=signals,
                            leave=None if owner else leave, collector=collector,
                            on_end=fetch.node_ended if fetch is not None else None,
                            **self._timeline(collector)).run()
        if result.left:
            return Outcome(exit_code=0, state=RunState.RUNNING, message=f"stopped following; run {plan.run_id} goes on")
        if result.interrupted and not owner:
            return Outcome(exit_code=result.exit_code, state=RunState.RUNNING, interrupted_by=result.signal,
                           message=f"stopped following; run {plan.run_id} goes on (end it with "
                                   f"`fsdpctl stop {plan.run_id}`)")
        return self._settle(result, node_runs, masker)

    def _timeline(self, collector: Optional[Collector]) -> dict:
        """The run's collector adds the moments its nodes' lines show to run.json's timeline."""
        if collector is None:
            return {}
        run, attempt = self.run, self.run.plan.attempt
        known = Timeline.from_json(run.record.timeline)
        started = epoch(run.record.started_at)
        # a collector that comes late (its run's lines are behind it) neither times nor warns on them
        fresh = self.owner or (started is not None and time.time() - started < 30)
        if not fresh:
            return {}
        return {"timeline": Timeline(known.origin if known is not None else None),
                "save_timeline": lambda timeline: run.add_timeline(timeline, attempt)}

    def _side_command(self, collector: Optional[Collector]) -> Optional[Callable[[NodeRun], Optional[str]]]:
        """For a collecting follower of a run it did not start: the command that sends a node's side files."""
        if collector is None or not collector.collecting:
            return None
        plan = self.run.plan

        def command(node: NodeRun) -> Optional[str]:
            specs = collector.specs(node.rank, node.node.host)
            return side_files_command(plan.run_dir, plan.host_python, node.rank, node.pid, specs) if specs else None
        return command

    def copied(self) -> Optional[dict[str, list[str]]]:
        """Wait for the copies of the nodes' torchrun logs and flight-recorder dumps, begun as each node
        ended: the run's end is said first. The dumps that came, by node; None where this follower
        copies nothing (it is not the run's owner, or the run directory is this machine's own)."""
        fetch, self.fetch = self.fetch, None
        return fetch.finish(self.node_runs) if fetch is not None else None

    def _reader(self, node_run: NodeRun) -> Callable[[str], Optional[str]]:
        """A small file of ``node_run``'s node, by its path there: from the copy begun as that node
        ended when it holds the file's folder (no new shell on the node before the end is said), else
        read on the node."""
        fetch = self.fetch

        def read(path: str) -> Optional[str]:
            local = fetch.copy_of(node_run.rank, path) if fetch is not None else None
            if local is None:
                return read_node_text(node_run.transport, path)
            try:
                return local.read_text(errors="replace")
            except OSError:  # not on the node when it was copied
                return None
        return read

    def _settle(self, result: RunResult, node_runs: list[NodeRun], masker: Masker) -> Outcome:
        """The end as the nodes left it: the failing rank's own error read, the logs brought whole,
        the run recorded by whoever may record it."""
        run, plan, owner = self.run, self.run.plan, self.owner
        failure = result.first_failure
        if failure and failure.kind == "exit":
            failing = next(r for r in node_runs if r.rank == failure.node_rank)
            read = self._reader(failing)
            if failure.error_file:
                error = read_error_file(read, failure.error_file)
                failure = dataclasses.replace(failure, error=masker.text(error) if error else error)
            failure = in_shutdown(failure, plan.run_dir, plan.attempt, read)
        state, record = result.settled.state, run.record
        exit_code = result.exit_code
        if record.stopped_at and state in (RunState.SUCCEEDED, RunState.FAILED, RunState.UNKNOWN):
            # `fsdpctl stop` asked for it: its ranks saved and left (0), or were killed; not a success
            state, exit_code = RunState.STOPPED, exit_code or 128 + getattr(signal, f"SIG{plan.stop_signal}")
        if result.hung and not self.acting:
            # The launcher that owns it does the same; this follower only reports.
            return Outcome(exit_code=result.exit_code, state=RunState.FAILED, first_failure=failure)
        lost = any(r.state == NodeState.LOST or r.streaming for r in node_runs)  # a stream cut short
        recorded = {"finished_at": now(), "exit_code": exit_code, "first_failure": failure}
        notes: list[str] = []
        if owner:
            # Every stream ran to its node's end: the copies here are whole (a lost node's is not).
            run.change(state=state, nodes=node_records(node_runs), logs_complete=not lost, **recorded)
            if lost:  # what a cut stream's node logged since, if it answers now (a lost node is not asked)
                notes = complete_logs(run, self.connect,
                                      frozenset(r.rank for r in node_runs if r.state == NodeState.LOST))
        elif self.acting and run.record.state is RunState.RUNNING:
            # Only a follower of a detached run that nobody owns, and nobody else has settled (stop
            # writes "stopped"), records how it ended; its collector's copies of the logs are whole
            # when no stream was cut.
            whole = {"logs_complete": not lost} if self.collecting else {}
            run.change(state=state, nodes=node_records(node_runs), **recorded, **whole)
        message = None
        if result.interrupted:
            by = signal.Signals(result.signal).name if result.signal else "a signal"
            message = f"run {plan.run_id} interrupted by {by}; every process of it was stopped"
        return Outcome(exit_code=exit_code, state=state, first_failure=failure, message=message,
                       interrupted_by=result.signal, notes=tuple(notes))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
