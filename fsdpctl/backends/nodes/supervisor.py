"""Follow a run's nodes to the end: stream their lines, learn how each one ends, and fail fast.

What the nodes say arrives through a feed. The process that started a foreground run listens to
the node agents it started (``AgentFeed``: the log, the exit, heartbeats both ways, a node silent
for the node timeout is lost). Any other follower (``logs -f``) reads each node's log with
``tail -F`` and polls its exit file (``TailFeed``). Either way the supervisor writes the local
logs, finds the first failure, and ends the other nodes. With ``signals`` it takes SIGINT, SIGTERM
and SIGHUP over while it follows (a second signal skips the grace period), as the CLI wants; without,
the caller's handlers stay, and a KeyboardInterrupt stops the run it owns the same way before it
is reported.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...live.collector import Collector
from ...plan.types import LaunchPlan
from ...rundir.lines import LineSplitter, LogLine, shown
from ...rundir.outcome import HANG_EXIT, NODE_LOST_EXIT, NodeEnd, settle
from ...rundir.paths import private_dir
from ...rundir.state import Failure, NodeState, RunState
from ...rundir.timeline import LineMoments, Timeline
from ..base import LineSink
from ..hang_watch import HangWatch
from ..signals import Interrupted, on_stop_signals
from .agent import PEER_FAILED_GRACE_SECONDS
from .commands import Answer, Data, Exited, Gone, Lost, Message, Note, Running, SideData, SideEnded, StreamEnded
from .feeds import Feed
from .runs import GRACE_SECONDS, KEEP_LINES, NodeRun, RunResult, first_failure_of
from .store_wait import StoreWait

WAIT_SECONDS = 0.5
DRAIN_SECONDS = 5.0
"""How long a node already known to have ended may stay silent before its stream counts as done."""
ROOM_CHUNKS = 64
"""Chunks of log bytes (up to 64 KiB each) waiting to be shown: a feed that finds no room waits, and
so does the node behind it (its log waits on disk). The launcher's memory stays bounded."""
ANSWERS = (Exited, Running, Gone, Lost)
TIMELINE_EVERY = 1.0
"""Seconds between writes of the run's timeline while new moments come in."""
RENDEZVOUS_NOTICE = 60.0
"""Seconds after the start with a node whose ranks have not started, before the launcher says what
the rendezvous waits for (sooner with a rendezvous timeout under twice this)."""


class Supervisor:
    """Streams every node's lines to a sink and local files, watches the nodes, and fails fast."""

    def __init__(self, plan: LaunchPlan, runs: list[NodeRun], log_dir: Path, sink: LineSink, feed: Feed,
                 grace: float = GRACE_SECONDS, write_local: bool = True, stop_on_interrupt: bool = True,
                 fail_fast: bool = True,
                 mask: Callable[[str], str] | None = None, watch: HangWatch | None = None, signals: bool = False,
                 leave: threading.Event | None = None, collector: Collector | None = None,
                 timeline: Timeline | None = None, save_timeline: Callable[[Timeline], None] | None = None,
                 on_end: Callable[[NodeRun], None] | None = None):
        self.plan, self.runs, self.log_dir, self.sink, self.grace = plan, runs, log_dir, sink, grace
        self.stop_signal = plan.stop_signal
        batch = getattr(sink, "lines", None)  # a sink that takes a batch at once (see api.events)
        self.sink_lines = batch if callable(batch) else (lambda lines: [sink(line) for line in lines])
        self.run_dir, self.run_id = plan.run_dir, plan.run_id
        container = getattr(plan, "container", None)  # a plan.json from before containers has none
        self.container_runtime = container.runtime if container else None
        self.feed = feed
        self.signals = signals  # take SIGINT/SIGTERM/SIGHUP over while following
        self.leave = leave  # set by the caller: stop following (a follower only; the run goes on)
        self.mask = mask  # the run's secrets, masked in every line shown or kept (None: there are none)
        self.write_local = write_local  # False for a second follower: the launching process writes them
        self.stop_on_interrupt = stop_on_interrupt  # a signal to `logs -f` ends the following, not the run
        self.fail_fast = fail_fast  # False: `logs -f` of a launcher's run, whose own link may be at fault
        self.lines: queue.Queue = queue.Queue()
        self.room = threading.Semaphore(ROOM_CHUNKS)
        self.last_data = time.monotonic()
        self.failed: NodeRun | None = None  # the first node seen failing
        self.store_wait: StoreWait | None = None  # the others wait while the store's node may say its end
        self.files: dict[int, Any] = {}
        self.merged: Any = None
        self.finished = threading.Event()
        self.hurry = threading.Event()  # a second signal: no grace period
        self.stopping = False  # ending every node on a signal: how they end is our doing, not a failure
        self.watch = watch
        self.hang_failure: Failure | None = None  # the watchdog ended the run
        self.collector = collector  # the run's one collector: side files' copies and the follower's word
        self.timeline = timeline  # the moments the nodes' lines show (the collector keeps them)
        self.moments = LineMoments(timeline) if timeline is not None else None
        self.save_timeline = save_timeline
        self.on_end = on_end  # told of each node whose script ended (its files are final)
        self.timeline_saved = 0.0
        self.began = time.monotonic()
        self.rendezvous_said = timeline is None

    def _open(self, name: str, binary: bool = False):
        target = self.log_dir / name if self.write_local else Path(os.devnull)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if binary:
            return open(fd, "ab")  # noqa: SIM115 - closed in run()'s finally
        return open(fd, "a", encoding="utf-8")  # noqa: SIM115 - closed in run()'s finally

    def _hurry(self, signum: int, frame) -> None:
        self.hurry.set()

    def _interrupted(self, signum: int, frame) -> None:
        on_stop_signals(self._hurry)  # before raising: a second signal must not interrupt the stop
        raise Interrupted(signum)

    # ---- the loop --------------------------------------------------------------------------------
    def run(self) -> RunResult:
        private_dir(self.log_dir)
        # node<R>.log here: the node's own log, byte for byte; merged.log: every line as shown.
        self.files = {run.rank: self._open(f"node{run.rank}.log", binary=True) for run in self.runs}
        self.merged = self._open("merged.log")
        on_nodes = f"{self.run_dir}/node{{rank}}.log on {{host}}"
        for run in self.runs:
            where = on_nodes.format(rank=run.rank, host=run.node.host)
            if self.write_local:
                where = f"{self.log_dir / f'node{run.rank}.log'} (and {where})"
            run.splitter = LineSplitter(run.rank, run.node.host, where)
        previous = on_stop_signals(self._interrupted) if self.signals else {}
        signum = None
        try:
            self.feed.start(self)
            self._loop(lambda: any(r.state == NodeState.RUNNING for r in self.runs))
            if not self._left():
                self._drain_ended()
        except (Interrupted, KeyboardInterrupt) as stop:
            signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
            if self.stop_on_interrupt:
                self._stop_all(signum)
        finally:
            self.finished.set()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.feed.close()
            for handle in (*self.files.values(), self.merged):
                handle.close()
            if self.collector is not None:
                self.collector.beat(self.node_states, ended=True)
            self._save_timeline(force=True)
        return self._result(signum)

    def _save_timeline(self, force: bool = False) -> None:
        if self.timeline is None or self.save_timeline is None or not self.timeline.changed:
            return
        if not force and time.monotonic() - self.timeline_saved < TIMELINE_EVERY:
            return
        self.timeline.changed = False
        self.timeline_saved = time.monotonic()
        self.save_timeline(self.timeline)

    def node_states(self) -> list[dict[str, Any]]:
        """How each node stands as this follower knows it (the follower's word, for viewers)."""
        now = time.monotonic()
        return [{"node_rank": r.rank, "host": r.node.host, "state": str(r.state), "exit_code": r.exit_code,
                 "quiet_s": round(now - r.last_heard, 1), "log_bytes": r.received, "stopped": r.stopped,
                 "detail": r.lost_reason} for r in self.runs]

    def _left(self) -> bool:
        return self.leave is not None and self.leave.is_set()

    def _loop(self, keep_going: Callable[[], bool], deadline: float | None = None) -> None:
        while keep_going() and (deadline is None or time.monotonic() < deadline) and not self._left():
            self._step()

    def _step(self) -> None:
        """Take what arrived (waiting a little for the first item), look at the nodes, flush."""
        try:
            batch = [self.lines.get(timeout=WAIT_SECONDS)]
        except queue.Empty:
            batch = []
        while batch and len(batch) < 1000:  # whatever else is already here, then one flush for all
            try:
                batch.append(self.lines.get_nowait())
            except queue.Empty:
                break
        # A node's answer (its exit, its loss) first: it may end the others, which must not wait behind
        # the lines already here. Lines keep their order, and a stream's end stays after its lines.
        batch.sort(key=lambda entry: not isinstance(entry[1], ANSWERS))
        for run, message in batch:
            if isinstance(message, ANSWERS):
                self._settle(run, message)
            elif isinstance(message, SideData):
                run.last_heard = time.monotonic()
                if self.collector is not None:
                    self.collector.take(run.rank, run.node.host, message.index, message.inode, message.offset,
                                        message.data)
            elif isinstance(message, SideEnded):
                run.side_streaming = False
            else:
                self._take(run, message)
                if isinstance(message, StreamEnded) and run.state == NodeState.RUNNING:
                    self.feed.ended_stream(self, run)
        for run, answer in self.feed.check(self):
            self._settle(run, answer)
        if self.store_wait is not None and self.store_wait.over(time.monotonic()):
            self._stop_others(hurry=self.store_wait.host.state == NodeState.LOST)
        self._flush()
        if self.collector is not None:
            self.collector.beat(self.node_states, extra={"run_state": str(RunState.RUNNING)})
        self._save_timeline()
        if not self.rendezvous_said and time.monotonic() - self.began > min(RENDEZVOUS_NOTICE,
                                                                           self.plan.rdzv_timeout / 2):
            self._say_rendezvous()
        if self.watch is not None and not self.stopping and self.failed is None:
            silent = self.watch.due()
            if silent is not None:
                self._hang(silent)

    def _say_rendezvous(self) -> None:
        """RENDEZVOUS_NOTICE on (half the rendezvous timeout, if sooner) and a node's ranks have not
        started: say, on each such node, what torchrun waits for at the rendezvous and when it gives up."""
        self.rendezvous_said = True
        if self.stopping or self.failed is not None or self.moments is None:
            return
        seen = self.moments.seen
        waiting = [r for r in self.runs if r.state == NodeState.RUNNING and "rendezvous" not in seen.get(r.rank, ())]
        if not waiting:
            return
        plan = self.plan
        began = [r.rank for r in self.runs if "torchrun" in seen.get(r.rank, ())]
        master = next((n for n in plan.nodes if n.host == plan.master_host), None)
        where = f"{plan.master_addr}:{plan.master_port}"
        if plan.rdzv_backend == "static":
            store = f"static: node rank 0 ({plan.nodes[0].host if plan.nodes else '?'}) serves the store at {where}"
        else:
            serving = f"node {master.node_rank} ({master.host})" if master is not None else plan.master_host
            store = f"c10d: the store at {where}, served by {serving}"
        after = time.monotonic() - self.began
        for run in waiting:
            if run.rank in began:
                text = (f"fsdpctl: no rank has started here after {after:.0f} s: torchrun waits for all "
                        f"{plan.num_nodes} nodes at the rendezvous ({store}); torchrun has started on {len(began)} of "
                        f"{plan.num_nodes} nodes; it gives up after {plan.rdzv_timeout} s (rendezvous.timeout)")
            else:
                text = (f"fsdpctl: torchrun has not started here after {after:.0f} s: the node script is still "
                        f"before it (the profile's setup lines, a container's start); the other nodes wait for "
                        f"it at the rendezvous for up to {plan.rdzv_timeout} s (rendezvous.timeout)")
            self._show(run, [LogLine(run.rank, run.node.host, text)])

    def _drain_ended(self) -> None:
        """Every node has ended: take what is still on its way, from each node as long as it is heard
        from. A node is heard from while its feed waits for room too, so a launcher slow to show a
        flood (a slow terminal, a loaded machine) still gets the whole end of every log, torchrun's
        failure summary included, before the run is settled."""
        quiet = max(DRAIN_SECONDS, self.feed.quiet_seconds)
        open_streams = [r for r in self.runs if (r.streaming or r.side_streaming) and r.state != NodeState.LOST]
        while any((r.streaming or r.side_streaming) and time.monotonic() - r.last_heard < quiet
                  for r in open_streams) and not self._left():
            self._step()

    def _hang(self, silent: float) -> None:
        """No progress for the watchdog's timeout: its handler gathers and reports; end the run if it says so."""
        verdict = self.watch.fire(silent)
        self._flush()
        if verdict.stop:
            self.hang_failure = verdict.failure
            self._stop_all(None)

    def _stop_all(self, signum: int | None) -> None:
        """An orderly stop of every node: the profile's stop signal to every rank, its grace period to
        exit by themselves (unless a second signal), then TERM and KILL."""
        self.stopping = True
        running = [r for r in self.runs if r.state == NodeState.RUNNING]
        hurried = self.hurry.is_set()
        save = signum is not None  # a person's or a job system's signal: time to save; a hang: none
        self.feed.stop(self, running, hurry=hurried, save=save)
        deadline = time.monotonic() + (self.grace if save else PEER_FAILED_GRACE_SECONDS) + 5.0
        while any(r.state == NodeState.RUNNING for r in running) and time.monotonic() < deadline:
            try:
                self._step()
            except KeyboardInterrupt:  # a second Ctrl-C without our handlers: no grace period
                self.hurry.set()
            if self.hurry.is_set() and not hurried:
                hurried = True
                self.feed.stop(self, [r for r in running if r.state == NodeState.RUNNING], hurry=True)
        for run in running:
            run.stopped = True
            if run.state == NodeState.RUNNING:
                run.state, run.exit_code = NodeState.FAILED, HANG_EXIT if signum is None else 128 + signum

    # ---- what the feed says ----------------------------------------------------------------------
    def put(self, run: NodeRun, message: Message) -> None:
        """For the feed's threads: a note, the end of the node's stream, or how its script stands."""
        self.lines.put((run, message))

    def put_data(self, run: NodeRun, chunk: bytes) -> None:
        """For the feed's threads: bytes of the node's log, once there is room for them (the node is
        heard from meanwhile: the launcher is the slow one, not the node)."""
        while not self.room.acquire(timeout=0.5):
            run.last_heard = time.monotonic()
            if self.finished.is_set():
                return
        self.lines.put((run, Data(chunk)))

    def _take(self, run: NodeRun, message: Data | Note | StreamEnded) -> None:
        splitter = run.splitter
        assert splitter is not None
        if isinstance(message, StreamEnded):
            run.streaming = False
            if self.timeline is not None:
                self.timeline.reached("logs", run.rank)
            if run.state != NodeState.LOST:  # a cut stream's last piece comes whole with the rest (log_copy)
                self._show(run, splitter.end())
            return
        run.last_heard = time.monotonic()
        if isinstance(message, Note):  # fsdpctl's own word about the node: shown and kept, not the node's log
            self._show(run, [LogLine(run.rank, run.node.host, message.text)])
            return
        self.room.release()
        self.files[run.rank].write(message.chunk)
        run.received += len(message.chunk)
        self._show(run, splitter.feed(message.chunk))

    def _show(self, run: NodeRun, lines: list[LogLine]) -> None:
        """A node's lines, shown and kept: per batch, not per line (a flood is 100,000s of them)."""
        if not lines:
            return
        if self.mask is not None:
            lines = [line._replace(text=self.mask(line.text)) for line in lines]
        if self.watch is not None:
            self.watch.saw_any(line.text for line in lines)
        if self.moments is not None:
            self.moments.saw(run.rank, lines)
        run.tail.extend(lines[-KEEP_LINES:])
        self.merged.write(shown(lines))
        self.sink_lines(lines)

    def _flush(self) -> None:
        for handle in (*self.files.values(), self.merged):
            handle.flush()
        flush = getattr(self.sink, "flush", None)
        if flush is not None:
            flush()

    def _settle(self, run: NodeRun, answer: Answer) -> None:
        """Apply what is known of a node's end; a failure ends the others."""
        if run.state != NodeState.RUNNING:
            return
        if isinstance(answer, Exited):
            if self.timeline is not None:
                self.timeline.reached("exit", run.rank)
            run.exit_code = answer.code
            run.state = NodeState.SUCCEEDED if run.exit_code == 0 else NodeState.FAILED
            if self.on_end is not None:
                self.on_end(run)
        elif isinstance(answer, Lost):
            run.state, run.exit_code, run.lost_reason = NodeState.LOST, NODE_LOST_EXIT, answer.why
            run.tail.append(LogLine(run.rank, run.node.host,
                                    f"fsdpctl: {run.node.host} stopped answering: {answer.why}"))
        elif isinstance(answer, Gone):
            run.state, run.exit_code = NodeState.FAILED, NODE_LOST_EXIT
            run.tail.append(LogLine(run.rank, run.node.host,
                                    "fsdpctl: the node script's wrapper vanished without an exit status"))
        if run.state in (NodeState.FAILED, NodeState.LOST):
            self._fail(run)

    def _fail(self, run: NodeRun) -> None:
        """The first node seen failing ends the others (which one caused it is decided at the end,
        from every node's complete last lines: news of nodes arrives in any order). One whose
        torchrun only lost the rendezvous store first gives the store's node a moment to say its
        own end (``StoreWait``)."""
        if self.stopping or (self.failed is not None and self.store_wait is None):
            return
        if self.failed is None:
            self.failed = run
            run.seen_failing_at = time.strftime("%Y-%m-%d_%H:%M:%S")  # torchrun's own stamp wins, when it has one
            self.store_wait = StoreWait.begin(run, self._store_host(), time.monotonic())
            if self.store_wait is not None:
                return
        self._stop_others(hurry=run.state == NodeState.LOST)

    def _stop_others(self, hurry: bool) -> None:
        self.store_wait = None
        others = [r for r in self.runs if r.state == NodeState.RUNNING] if self.fail_fast else []
        for other in others:
            other.stopped = True
        if others:
            # A lost node's peers wait in a collective on it: their ranks never reach a handler, so a
            # grace period only delays the next attempt. Any other failure: a short one.
            self.feed.stop(self, others, hurry=hurry, peer_failed=True)

    def _store_host(self) -> NodeRun | None:
        """The node whose torchrun holds the rendezvous store (the plan's master)."""
        master = getattr(self.plan, "master_addr", None)
        return next((r for r in self.runs if master in (r.node.address, r.node.host)),
                    next((r for r in self.runs if r.rank == 0), None))

    def _result(self, signum: int | None) -> RunResult:
        ends = [NodeEnd(node_rank=r.rank, host=r.node.host, state=r.state, exit_code=r.exit_code, stopped=r.stopped,
                        failure=first_failure_of(r, r.seen_failing_at)
                        if r.state in (NodeState.FAILED, NodeState.LOST) else None) for r in self.runs]
        settled = settle(ends, interrupted_by=signum, hang=self.hang_failure)
        return RunResult(settled, signal=signum, left=self._left() and settled.state is RunState.RUNNING)
