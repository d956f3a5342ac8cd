"""Following a Slurm job: its nodes' logs as they grow until Slurm says it has ended, then how it
ended, settled like any run's (the failing rank's own exit code, from torchrun's summary in its
node's log), and recorded."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path
from typing import Optional

from ...live.collector import Collector, listen, with_export_notes
from ...live.exports import LiveExports
from ...live.layout import collector_lock
from ...rundir.lines import LogLine
from ...rundir.outcome import HANG_EXIT, NodeEnd, settle
from ...rundir.record import RunRecord, epoch, now
from ...rundir.rundir import RunDir
from ...rundir.state import Failure, NodeState, Outcome, RunState
from ...rundir.timeline import LAUNCHER, LineMoments, Timeline
from ..base import LineSink
from ..hang_watch import HangWatch
from ..signals import Interrupted, on_stop_signals, raise_interrupted, restore
from ..torchrun import has_summary, in_shutdown, torchrun_failure
from . import client, states
from .logs import NodeLogs, follow
from .plan import SlurmPlan
from .steps import metrics_text, spare_changes, step_nodes

BATCH_TAIL_LINES = 20
TAIL_BYTES = 256 * 1024
"""Of each node's log, what is read for torchrun's failure summary (it is at the end)."""


class SlurmFollower:
    """Follows one Slurm job (whoever submitted it: the job is Slurm's, not a launcher's)."""

    def __init__(self, run: RunDir, how: str, collect: bool = False):
        self.run, self.how, self.collect = run, how, collect

    def follow(self, sink: LineSink, *, watch: HangWatch | None = None, signals: bool = False,
               leave: threading.Event | None = None) -> Outcome:
        """The node logs as they grow until Slurm says the job has ended; records how it ended.
        An interruption stops following only: the job is Slurm's, and goes on. A hang the watch
        ends is cancelled with scancel and recorded as failed (exit 124). A collecting follower
        (``collect``) says after each look how the job stands (``live/follower.json``): the nodes
        write into the shared run directory, which viewers read themselves."""
        with collector_lock(self.run.root) if self.collect else contextlib.nullcontext(False) as got:
            collector = Collector(self.run.root, self.run.plan, self.run.plan.attempt,
                                  exports=LiveExports(self.run)) if self.collect and got else None
            listen(collector, sink, watch)  # the ranks' rows to who asks (not their printed lines)
            try:
                outcome = self._follow(sink, watch, signals, leave, collector)
            finally:
                if collector is not None:
                    collector.beat(list, ended=True)
            return with_export_notes(outcome, collector)

    def _follow(self, sink: LineSink, watch: HangWatch | None, signals: bool, leave: threading.Event | None,
                collector: Optional[Collector]) -> Outcome:
        run = self.run
        plan, job_id = run.plan, str(run.record.job_id)
        previous = on_stop_signals(raise_interrupted) if signals else {}  # SIGTERM and SIGHUP as Ctrl-C
        hang: list[Failure] = []
        timeline = self._timeline(collector)
        moments = LineMoments(timeline) if timeline is not None else None
        queued = [timeline is not None]

        def out_of_the_queue() -> None:
            if queued[0] and timeline is not None:
                queued[0] = False
                timeline.end("queued")

        def show(line: LogLine) -> None:
            if watch is not None:
                watch.saw(line.text)
            if moments is not None:
                out_of_the_queue()  # a node's line: the job runs (Slurm may say so a poll later)
                moments.saw(line.node_rank, (line,))
            sink(line)

        def on_state(state: client.JobState, logs: NodeLogs) -> None:
            _said(collector, state, logs)
            if timeline is not None:
                if state.finished or states.live_state(state.state) is RunState.RUNNING:
                    out_of_the_queue()
                if state.finished:
                    timeline.reached("exit")
                if timeline.changed:
                    timeline.changed = False
                    run.add_timeline(timeline, plan.attempt)

        def hung() -> bool:
            silent = watch.due() if watch is not None else None
            if silent is not None and (verdict := watch.fire(silent)).stop:
                hang.append(verdict.failure)
                client.cancel(job_id)
                return True
            return False

        left = f"stopped following; Slurm job {job_id} goes on (end it with `fsdpctl stop {plan.run_id}` or " \
               f"`scancel {job_id}`)"
        state: Optional[client.JobState] = None
        try:
            state = follow(Path(plan.run_dir), plan.num_nodes, job_id, show, requeueable=SlurmPlan.of(plan).requeue,
                           give_up=hung, leave=leave, on_state=on_state)
        except (Interrupted, KeyboardInterrupt) as stop:
            signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
            return Outcome(exit_code=128 + signum, state=RunState.RUNNING, interrupted_by=signum, message=left)
        finally:
            restore(previous)
            if timeline is not None:
                if state is not None and state.finished:
                    timeline.reached("logs")
                run.add_timeline(timeline, plan.attempt)
        if state is None:
            return Outcome(exit_code=0, state=RunState.RUNNING, message=left)
        if hang:
            run.change(state=RunState.FAILED, exit_code=HANG_EXIT, finished_at=now(), first_failure=hang[0],
                       job={"slurm_state": state.state})
            return Outcome(exit_code=HANG_EXIT, state=RunState.FAILED, first_failure=hang[0])
        record = record_end(run, state)
        outcome_state, code, failure = record.state, int(record.exit_code or 0), record.first_failure
        notes = () if outcome_state is RunState.SUCCEEDED else tuple(
            batch_output(run.record, f"job {job_id} ended {state.state}"))
        return Outcome(exit_code=code, state=outcome_state, first_failure=failure,
                       message=f"Slurm job {job_id} {state.state} (exit {code})", notes=notes)


    def _timeline(self, collector: Optional[Collector]) -> Optional[Timeline]:
        """The collector of a job it saw queued (or just started) times its queue and its nodes' lines."""
        run = self.run
        record = run.record
        submitted = epoch(record.submitted_at)
        late = record.state not in (RunState.SUBMITTED, RunState.STARTING) and time.time() - submitted > 30 \
            if submitted is not None else True
        if collector is None or late:
            return None
        known = Timeline.from_json(record.timeline)
        timeline = Timeline(known.origin if known is not None else submitted)
        sent = known.spans.get("submit", {}).get(LAUNCHER) if known is not None else None
        # queued from sbatch's answer (run.json's submitted_at has whole seconds only)
        timeline.begin("queued", at=known.origin + sent[1] if known is not None and sent else submitted)
        return timeline


def record_end(run: RunDir, state: client.JobState, *, unless_ended: bool = False) -> RunRecord:
    """Record in run.json how the run's job ended, as Slurm (``state``, a finished job's) and the
    nodes' logs say: its state (a job ``fsdpctl stop`` cancelled is stopped), exit code, first failure
    and what spares changed. ``unless_ended``: leave a record that says the run ended already (its
    follower, or ``stop``, wrote it: they know more), or that is now of another job (a newer attempt)."""
    outcome_state, code = states.ending(state.state, state.exit_code)
    if run.record.stopped_at and outcome_state in (RunState.CANCELLED, RunState.SUCCEEDED, RunState.FAILED):
        outcome_state = RunState.STOPPED  # fsdpctl stop ended it (its ranks saved and left, or scancel did)
    failure = None
    if outcome_state is RunState.FAILED:
        failure = failure_in_logs(run)
        code = failure.exit_code if failure is not None else code
    run_dir = Path(run.plan.run_dir).expanduser()
    changes = dict(state=outcome_state, exit_code=code, finished_at=now(), first_failure=failure,
                   job={"slurm_state": state.state}, **spare_changes(run_dir, metrics_text(run_dir)))
    if not unless_ended:
        return run.change(**changes)
    job_id = run.record.job_id
    return run.change_if(lambda record: not record.state.is_over and record.job_id == job_id, **changes)


def _said(collector: Optional[Collector], state: client.JobState, logs: NodeLogs) -> None:
    """The collecting follower's word: Slurm's state of the job, each node as its log names it."""
    if collector is None:
        return
    live = states.live_state(state.state) if not state.finished else None
    node_state = str(NodeState.PENDING if live is RunState.SUBMITTED else NodeState.RUNNING if live else
                     NodeState.UNKNOWN)
    nodes = [{"node_rank": rank, "host": logs.hosts[rank], "state": node_state, "ranks": logs.ranks[rank]}
             for rank in range(len(logs.hosts))]
    run_state = live or states.run_state(state.state, state.exit_code)
    collector.beat(lambda: nodes, extra={"slurm_state": state.state, "restarts": state.restarts,
                                         "run_state": str(run_state)})


def _tail_lines(path: Path) -> list[str]:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
            return handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []


def failure_in_logs(run: RunDir) -> Optional[Failure]:
    """The failure behind a failed job, from its nodes' logs (the shared run directory): a node whose
    torchrun printed its failure summary failed on its own; the others Slurm ended (``srun
    --kill-on-bad-exit``). None when no node says (the batch script itself failed)."""
    run_dir = Path(run.plan.run_dir).expanduser()
    count = step_nodes(run_dir, run.plan.num_nodes)  # the newest step's: a rank beyond is an earlier step's
    logs = NodeLogs(run_dir, count)
    logs.read_new(lambda line: None)  # the nodes name themselves in their first line
    ends = []
    for rank in range(count):
        lines = _tail_lines(run_dir / f"node{rank}.log")
        said = has_summary(lines)
        failure = torchrun_failure(lines, host=logs.hosts[rank], node_rank=rank, exit_code=1) if said else None
        ends.append(NodeEnd(node_rank=rank, host=logs.hosts[rank], state=NodeState.FAILED if said
                            else NodeState.SUCCEEDED, failure=failure, exit_code=failure.exit_code if failure else 0))
    return in_shutdown(settle(ends).first_failure, str(run_dir), run.plan.attempt, _read_text)


def _read_text(path: str) -> Optional[str]:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def batch_output(record: RunRecord, why: str, lines: int = BATCH_TAIL_LINES) -> list[str]:
    """The end of the batch script's own output (where Slurm and the setup lines report errors)."""
    path = Path(record.job.get("slurm_output") or "")
    if not path.is_file():
        return []
    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return [f"fsdpctl: {why}; the end of the batch output ({path}):", *(f"  {line}" for line in tail)]
