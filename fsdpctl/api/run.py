"""``Run``: one run, wherever it runs, to wait on, read, stop and continue (submitit's ``Job``,
torchx's app handle). ``launch`` and ``submit`` return one; ``get_run`` finds one by id."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..errors import WaitTimeout
from ..rundir.lines import LogLine
from ..rundir.state import Outcome, RunState
from .log_lines import LogLines

if TYPE_CHECKING:
    from ..accounting.account import Account
    from ..backends.base import Backend
    from ..diagnose.stacks import StackReport
    from ..live.snapshot import Snapshot
    from ..metrics.summary import Report
    from ..plan.types import LaunchPlan
    from ..profiles.schema import ClusterProfile
    from ..rundir.index import Listed
    from ..rundir.rundir import RunDir
    from ..rundir.status import RunStatus
    from .events import EventHandler
    from .options import PathLike
    from .tracing import StepTrace


@dataclass(frozen=True)
class RunInfo:
    """A run as its run.json records it (nothing asked of its nodes): what ``fsdpctl runs`` lists."""

    run_id: str
    state: RunState
    backend: str
    num_nodes: Optional[int]
    exit_code: Optional[int]
    attempt: int
    created_at: Optional[str]
    path: Path
    recoveries: tuple[str, ...] = ()
    """Each later attempt's spares and what its restart cost ("attempt 2: n4 in the place of n2
    (lost: ...); stood still 21.3 s, 5 step(s) done again")."""
    started_at: Optional[str] = None
    """When its newest attempt started (a scheduler's run: when the scheduler took it), ISO 8601."""
    ended_at: Optional[str] = None
    """When it ended (it finished, or ``stop`` ended it); None while it runs."""
    logs_complete: bool = False
    """The copies here of what its nodes wrote are whole (its follower saw every node's end)."""

    def duration_s(self, now: Optional[datetime] = None) -> Optional[float]:
        """Seconds from its start to its end, or to ``now`` (default: the time now) while it is live;
        None where run.json does not say when it started, or not when an ended run ended."""
        start = _moment(self.started_at)
        end = _moment(self.ended_at) if self.state.is_over else (now or datetime.now().astimezone())
        return None if start is None or end is None else max(0.0, (end - start).total_seconds())

    def to_json(self, now: Optional[datetime] = None) -> dict[str, Any]:
        """The documented ``runs --json`` form of one run."""
        duration = self.duration_s(now)
        return {"run_id": self.run_id, "state": str(self.state), "backend": self.backend, "num_nodes": self.num_nodes,
                "created_at": self.created_at, "started_at": self.started_at, "ended_at": self.ended_at,
                "duration_s": None if duration is None else round(duration, 1), "exit_code": self.exit_code,
                "attempt": self.attempt, "path": str(self.path), "recoveries": list(self.recoveries)}


def _info_of(row: Mapping[str, Any], path: Path) -> RunInfo:
    """A run's ``RunInfo`` from its row in the registry index (``fsdpctl.rundir.index``)."""
    return RunInfo(str(row["run_id"]), RunState.parse(row["state"]), str(row["backend"]), row["num_nodes"] or None,
                   row["exit_code"], int(row["attempt"]), row["created_at"], path, tuple(row["recoveries"]),
                   started_at=row["started_at"], ended_at=row["ended_at"], logs_complete=bool(row["logs_complete"]))


def _moment(text: Optional[str]) -> Optional[datetime]:
    """A time as run.json writes it (ISO 8601 with its offset); None when absent or unreadable."""
    try:
        moment = datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    return moment.astimezone() if moment is not None else None


class Run:
    """A run and the backend that acts on it. A run this process started keeps the backend instance
    that started it (which alone can follow a foreground run as its owner); any other is opened on
    first use. ``close()`` (or ``with``) releases its connections; a later call opens them again."""

    def __init__(self, run_dir: RunDir, backend: Optional[Backend] = None):
        self._loaded: Optional[RunDir] = run_dir
        self._root, self._backend, self._listing = run_dir.root, backend, None

    @classmethod
    def _listed(cls, listing: Listed, run_dir: Optional[RunDir] = None) -> Run:
        """A run as the registry index lists it: its directory is read (plan, profile) on first use."""
        run = cls.__new__(cls)
        run._loaded, run._root, run._backend, run._listing = run_dir, listing.path, None, listing
        return run

    @property
    def _dir(self) -> RunDir:
        if self._loaded is None:
            from ..rundir.rundir import load_run

            self._loaded = load_run(self._root)
        return self._loaded

    @_dir.setter
    def _dir(self, run_dir: RunDir) -> None:  # a later attempt's directory (resume, restart)
        self._loaded, self._root, self._listing = run_dir, run_dir.root, None

    # ---- what the run is -------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """fsdpctl's id of the run (``<profile>-<date>-<time>-<token>``)."""
        if self._loaded is None and self._listing is not None:
            return str(self._listing.row["run_id"])
        return self._dir.run_id

    @property
    def path(self) -> Path:
        """The run's directory here (plan, scripts, run.json, logs)."""
        return self._root

    @property
    def plan(self) -> LaunchPlan:
        """The plan of its newest attempt."""
        return self._dir.plan

    @property
    def profile(self) -> ClusterProfile:
        """The profile as it was when the run was made."""
        return self._dir.profile

    @property
    def attempt(self) -> int:
        """The run's newest attempt (1, then 2 and on after a resume or a restart)."""
        return self._dir.plan.attempt

    @property
    def info(self) -> RunInfo:
        """What run.json says now; asks no node. run.json is the one record of the run's state: a
        scheduler's word on a live job is written into it by whoever asks (``status``, ``runs``)."""
        if self._listing is not None and self._listing.current():
            return _info_of(self._listing.row, self._root)
        self._listing = None
        record = self._dir.record
        return RunInfo(self.run_id, record.state, record.backend, record.num_nodes or None, record.exit_code,
                       record.attempt, record.created_at, self.path, record.recoveries(),
                       started_at=record.started_at or record.submitted_at,
                       ended_at=record.finished_at or record.stopped_at, logs_complete=record.logs_complete)

    def timeline(self, attempt: Optional[int] = None) -> list[dict[str, Any]]:
        """Where an attempt's seconds went (default: the newest attempt's), asking no node: each phase
        of its launch in order (``phase``, ``what``), when its first node began it and its slowest
        node was done (``begin``, ``done``: seconds after the launch began), what it added to the
        launch (``added``), and where nodes differ the fastest and slowest node."""
        from ..rundir.timeline import rows

        record = self._dir.record
        if attempt is None or attempt == record.attempt:
            return rows(record.timeline)
        earlier = next((a for a in record.attempts if a.attempt == attempt), None)
        return rows(earlier.timeline) if earlier is not None else []

    def __repr__(self) -> str:
        return f"<fsdpctl.Run {self.run_id} {self.info.state}>"

    @property
    def backend(self) -> Backend:
        """The backend that acts on the run (opened on first use)."""
        if self._backend is None:
            from ..backends import backend_for_run

            self._backend = backend_for_run(self._dir)
        return self._backend

    def close(self) -> None:
        """Release the backend's connections to the nodes."""
        if self._backend is not None:
            self._backend.close()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- how it stands ---------------------------------------------------------------------------
    def status(self) -> RunStatus:
        """The run's state, each node's, every attempt and the newest metrics: asked of the nodes (or
        the scheduler) while the run is live, else as recorded."""
        return self.backend.status(self._dir)

    def watch(self, interval: float = 2.0, *, until_over: bool = True, gap: float = 0.0) -> Iterator[Snapshot]:
        """Snapshots of the run as it goes (``fsdpctl.live.Snapshot``: progress, ETA, loss, each node
        and its GPUs now, each rank's newest window, the straggler and its cause, attempts, spares,
        the newest log lines): one at once, then one whenever something changed and at least every
        ``interval`` seconds (never two within ``gap`` seconds), the last one showing the run over
        (``until_over=False``: on until you stop). Read from the run's directory here, which its
        collector keeps current: watching asks the nodes nothing. A run nobody collects any more says
        so (``run.live`` false, ``run.note``)."""
        from ..errors import UsageError
        from ..live.model import LiveRun, snapshots

        if interval <= 0:
            raise UsageError(f"watch interval {interval:g} s: must be positive", "give seconds, e.g. 2")
        backend = self.backend
        taken = snapshots(LiveRun(self._dir, backend.log_tail, backend.scheduler_status), interval,
                          until_over=until_over, gap=gap)
        return (dataclasses.replace(snap, goodput=self._goodput_line()) for snap in taken)

    def _goodput_line(self) -> Optional[str]:
        from ..accounting.cache import counted

        return counted(self)[1]

    def wait(self, timeout: Optional[float] = None, *, on_event: Optional[EventHandler] = None,
             handle_signals: bool = False) -> Outcome:
        """Wait for the run to end and return how it ended (``exit_code``, ``state``,
        ``first_failure``). A run still going is followed: its lines and what happens reach
        ``on_event``; a detached run's end is recorded by its follower. Raises ``WaitTimeout`` after
        ``timeout`` seconds (the run goes on). ``handle_signals``: take SIGINT/SIGTERM/SIGHUP over
        while waiting (as the CLI does); otherwise a KeyboardInterrupt stops waiting, not the run."""
        from .events import Emitter
        from .following import follow_attempts_from_outside

        record = self._dir.record
        if record.state.is_over:
            return record.outcome()
        leave = threading.Event()
        timer = threading.Timer(timeout, leave.set) if timeout is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            # Waiting follows the run (its next attempts too): it collects it, unless another process does.
            self._dir, outcome = follow_attempts_from_outside(self.backend, self._dir, Emitter(on_event),
                                                              signals=handle_signals, leave=leave, collect=True)
        finally:
            if timer is not None:
                timer.cancel()
        if outcome.left and leave.is_set():
            raise WaitTimeout(f"run {self.run_id}: still {self.info.state} after {timeout:g} s",
                              "wait again, or stop it with run.stop()")
        return outcome

    def logs(self, *, follow: bool = False, rank: Optional[int] = None, host: Optional[str] = None,
             attempt: Optional[int] = None) -> LogLines:
        """The run's lines, in order per node (``attempt``: an earlier attempt's). ``follow``: keep
        reading a live run until it ends. ``rank``, ``host``: only that rank's (or host's) lines.
        What could not be read (a node that did not answer) is in the result's ``notes`` afterwards."""
        from ..errors import UsageError

        if attempt is not None and not 1 <= attempt <= self.attempt:
            raise UsageError(f"--attempt {attempt}: run {self.run_id} has {self.attempt} attempt(s)",
                             f"give --attempt 1 to {self.attempt}, or leave it out for the newest")
        if follow and attempt not in (None, self.attempt):
            raise UsageError(f"--attempt {attempt}: ended; only the newest attempt can be followed",
                             "drop follow to read it, or attempt to follow the newest")

        def keep(line: LogLine) -> bool:
            return (host is None or line.host == host) and (rank is None or line.rank == rank)

        def produce(sink: Callable[[LogLine], None], leave: threading.Event) -> list[str]:
            if not follow:
                return self.backend.read_logs(self._dir, sink, attempt)
            from .events import Emitter
            from .following import follow_from_outside

            def lines_only(event: Any) -> None:
                if isinstance(event, LogLine):
                    sink(event)

            follow_from_outside(self.backend, self._dir, Emitter(lines_only), signals=False, leave=leave)
            return []

        return LogLines(produce, keep)

    def stacks(self, *, native: bool = False, py_spy: bool = True, flight: bool = False) -> StackReport:
        """Where every rank is now: each rank's stack (py-spy where a node has it, else fsdpctl's own
        dump handler; ``native``: C/C++ frames too), grouped by where they stand. ``flight``: every
        rank also dumps torch's flight recorder (``fetch("flight")`` brings the dumps)."""
        from ..diagnose.stacks import StackReport
        from ..errors import UsageError

        state = self.info.state
        if state.is_over:
            raise UsageError(f"run {self.run_id} is {state}: no rank is running",
                             "stacks reads live ranks; a hang's stacks are kept in runs/<id>/hang/")
        return StackReport(self.run_id, self.backend.stacks(self._dir, flight=flight, py_spy=py_spy, native=native))

    def trace_steps(self, steps: int = 3, *, ranks: str = "auto", shapes: bool = False, stack: bool = False,
                    max_mb: float = 100.0, timeout: Optional[float] = None) -> StepTrace:
        """Profile ``steps`` steps of this live run on ``ranks`` (a list like ``"0,3"``, ``all``,
        ``straggler``, or ``auto``: the straggler, the two ranks nearest the median and rank 0) with
        torch.profiler, no code of the program's own; the traces merged into one (``StepTrace.trace``)
        with a summary of each rank's compute, communication and idle time (``fsdpctl profile``)."""
        from .tracing import trace_steps

        return trace_steps(self, steps=steps, ranks=ranks, shapes=shapes, stack=stack, max_mb=max_mb, timeout=timeout)

    # ---- acting on it ----------------------------------------------------------------------------
    def stop(self, grace: Optional[int] = None, signal: Optional[str] = None) -> dict[str, str]:
        """End every process of the run on every node and record it as stopped; per host, what remains
        (empty: nothing). Every rank gets ``signal`` first (a name: ``TERM``, ``USR1``, ``HUP``,
        ``INT``) and ``grace`` seconds to save and exit by itself, then TERM and KILL end what is left
        (default: the profile's ``stop_signal`` and ``stop_grace``; Slurm: ``scancel --signal``, then
        ``scancel``). The bundled workload saves a checkpoint on it and exits 0."""
        from ..errors import UsageError
        from ..profiles.schema import STOP_SIGNALS

        if signal is not None and signal.upper().removeprefix("SIG") not in STOP_SIGNALS:
            raise UsageError(f"--signal: {signal!r} is not a stop signal", f"give one of {', '.join(STOP_SIGNALS)}")
        if grace is not None and not 0 <= grace <= 86400:
            raise UsageError(f"--grace: {grace} is outside 0-86400",
                             "give the seconds the ranks have to save, e.g. 120")
        return self.backend.stop(self._dir, grace, signal.upper().removeprefix("SIG") if signal else None)

    def fetch(self, path: str = ".") -> dict[str, list[str]]:
        """Copy ``path`` (under ``$FSDPCTL_RUN_DIR`` on the nodes; default: all the run wrote) into
        ``runs/<id>/fetched/node<R>/``; per node, the local files (empty: no such path there)."""
        from ..errors import UsageError

        if path.startswith(("/", "~")) or ".." in path.split("/"):
            raise UsageError(f"{path}: not a path inside the run directory", "give it relative to $FSDPCTL_RUN_DIR, "
                             "e.g. outputs/model.pt")
        return self.backend.fetch(self._dir, path)

    def report(self, plot: Optional[PathLike] = None, *, fetch: bool = True) -> Report:
        """This run's report (``fsdpctl report``): its metrics brought back from the nodes and summed
        up (losses, tokens/s, time per step, memory per rank, the straggler named); with ``plot``, a
        folder, its figures as PNG files (needs matplotlib)."""
        from .summaries import report_of

        return report_of([self], plot=plot, fetch=fetch)

    def goodput(self, *, fetch: bool = True) -> Optional[Account]:
        """Where this run's time went (``report``'s goodput section): every second from its start to its
        end (to now while it runs) in one category, in seconds and GPU-hours, with its ETTR and strict
        goodput (None: it has not started)."""
        from .summaries import goodput_of

        return goodput_of(self, fetch=fetch)

    def resume(self, *, steps: Optional[int] = None, epochs: Optional[int] = None, detach: bool = False,
               preflight: bool = True, fetch: tuple[str, ...] = (), node_timeout: Optional[int] = None,
               hang_timeout: Optional[int] = None, on_hang: Optional[str] = None,
               max_restarts: Optional[int] = None, on_event: Optional[EventHandler] = None,
               handle_signals: bool = False) -> Run:
        """Start the run's next attempt in its own directory with its own plan (the bundled workload
        from its newest complete checkpoint; ``steps``/``epochs`` may grow it) and, unless
        ``detach``, follow it to its end as ``launch`` does. Refused (UsageError) for a live run, a
        bundled run without a complete checkpoint, or one with nothing left to train. Returns this
        run, now at its new attempt. A Slurm run is submitted again (no preflight)."""
        from ..job import JobOptions
        from ..rundir.attempts import begin_attempt
        from ..rundir.rundir import attempt_lock
        from .attempts import plan_resume
        from .events import Emitter
        from .following import start_attempt
        from .notifying import notifier_for, notify_spec_of
        from .restarting import follow_with_restarts

        JobOptions(node_timeout=node_timeout, hang_timeout=hang_timeout, on_hang=on_hang, max_restarts=max_restarts)
        notifier = None if detach else notifier_for(notify_spec_of(self._dir), Emitter(on_event))
        emit = notifier or Emitter(on_event)  # a detached attempt's follower process sends its notices
        backend = self.backend
        with attempt_lock(self._dir):  # one next attempt at a time: a second resume waits for none
            attempt = plan_resume(backend, self._dir, steps=steps, epochs=epochs, node_timeout=node_timeout,
                                  hang_timeout=hang_timeout, on_hang=on_hang, max_restarts=max_restarts)
            current = self._dir

            def open_next() -> RunDir:
                where = f"from step {attempt.from_step}" if attempt.from_step is not None else \
                    "(your program resumes itself)"
                emit.notice(f"run {self.run_id}: attempt {attempt.plan.attempt} {where}")
                return begin_attempt(current, attempt.plan, attempt.scripts, attempt.from_step)

            started = start_attempt(backend, attempt.plan, attempt.payload(), emit, detached=detach,
                                    preflight=preflight, open_run=open_next)
        assert started is not None  # a first preflight raises rather than return nothing
        self._dir, follower = started
        if not detach:
            try:
                self._dir, _ = follow_with_restarts(backend, self._dir, follower, emit, signals=handle_signals,
                                                    fetch=fetch)
            finally:
                if notifier is not None:
                    notifier.close()
        return self
