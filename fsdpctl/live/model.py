"""The live-run model: snapshots of one run made from its directory here and nothing else (the
collector keeps it current), so any number of viewers cost the nodes nothing. Each snapshot reads
only what the files gained since the last one.

Where a snapshot's parts come from: the run's record (``run.json``: state, attempts, replacements),
the collecting follower's word (``live/follower.json``: how each node stands now) while it lives,
the copies of the nodes' ``metrics.jsonl`` (progress, loss, each rank's windows, the straggler) and
GPU samples, the log lines (from the backend's ``log_tail``), the profile's spares and exclusions.
A run whose follower is gone while its record says it runs is shown as not live, with the time the
data stops; a scheduler's run without a follower asks the scheduler (``scheduler``), never its nodes.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

from ..metrics.gpu_samples import GPU_SAMPLES_SHOWN, gpu_cause, sample_of
from ..node.gpu_watch import HARDWARE_FAULT
from ..rundir.lines import LogLine, ranks_in_log, ranks_said
from ..rundir.paths import read_json
from ..rundir.record import epoch
from ..rundir.rundir import RunDir, load_run
from ..rundir.state import RunState
from ..rundir.status import RunStatus
from . import layout
from .metrics_feed import MetricsFeed
from .snapshot import GpuNow, HostsNow, NodeNow, Progress, RankNow, Snapshot
from .tails import LineTail, LogTail

LOG_LINES = 500
"""Log lines a snapshot carries (the newest)."""
METRICS_START_BACK = 4 << 20
"""Of a long run's metrics, what a new viewer reads first: the newest rows (hundreds of windows even at
128 ranks) are what a snapshot shows; the workload's own rows carry its straggler verdict."""
GPU_START_BACK = 64 << 10
"""Of a node's GPU samples, what a new viewer reads first (the newest samples are all it shows)."""
SLOW_SECONDS = 5.0
"""How often what changes seldom is read again: the profile's exclusions, the scheduler's word."""


class LiveRun:
    """Snapshots of one run. ``log_tail``: its log lines as they come (the backend's); ``scheduler``:
    how a scheduler says the run stands (asked at most every few seconds, and only while no follower
    collects the run), for a backend that has one."""

    def __init__(self, run: RunDir, log_tail: Callable[[RunDir], LogTail],
                 scheduler: Optional[Callable[[RunDir], Optional[RunStatus]]] = None):
        self.run = run
        self.make_log_tail = log_tail
        self.scheduler = scheduler
        self._begin_attempt()
        self.metrics_tails: dict[Path, LineTail] = {}
        self.gpu_tails: dict[Path, LineTail] = {}
        self.gpu_samples: dict[int, deque[dict[str, Any]]] = {}
        self.metrics = MetricsFeed(run.plan.world_size)
        self.scheduler_said: Optional[RunStatus] = None
        self.slow_at = 0.0
        self.exclusions: tuple[dict[str, Any], ...] = ()
        self.record_mtime = 0.0

    def _begin_attempt(self) -> None:
        self.attempt = self.run.plan.attempt
        self.log_tail = self.make_log_tail(self.run)
        self.logs: deque[LogLine] = deque(maxlen=LOG_LINES)
        self.ranks_said: dict[int, str] = {}
        self.hosts_seen: dict[int, str] = {}
        self.faults: dict[int, list[str]] = {}

    # ---- what changed ----------------------------------------------------------------------------
    def changed(self) -> bool:
        """Whether anything a snapshot shows may have changed (a few stat calls; nothing read)."""
        root = self.run.root
        try:
            mtime = max((root / "run.json").stat().st_mtime, _mtime(layout.live_dir(root) / layout.FOLLOWER))
        except OSError:
            mtime = 0.0
        if mtime != self.record_mtime:
            return True
        tails = [*self.metrics_tails.values(), *self.gpu_tails.values()]
        return self.log_tail.pending() or any(t.pending() for t in tails) or self._new_files()

    def _new_files(self) -> bool:
        plan = self.run.plan
        found = layout.metrics_files(self.run.root, plan) + layout.gpu_files(self.run.root, plan)
        return any(p not in self.metrics_tails and p not in self.gpu_tails for p in found)

    # ---- reading ---------------------------------------------------------------------------------
    def _read(self) -> None:
        record_attempt = self.run.record.attempt
        if record_attempt != self.attempt:  # a new attempt: its own plan, nodes and log
            self.run = load_run(self.run.root)
            self._begin_attempt()
        plan = self.run.plan
        for path in layout.metrics_files(self.run.root, plan):
            tail = self.metrics_tails.setdefault(path, LineTail(path, start_back=METRICS_START_BACK))
            lines = tail.read()
            if tail.began_again:  # the file was written anew (an attempt of a run written here)
                self.metrics = MetricsFeed(plan.world_size)
                for other in self.metrics_tails.values():
                    other.inode = None  # every copy again, into the new feed
                lines = tail.read()
            self.metrics.add_lines(lines)
        for path in layout.gpu_files(self.run.root, plan):
            tail = self.gpu_tails.setdefault(path, LineTail(path, start_back=GPU_START_BACK))
            for line in tail.read():
                self._gpu_sample(line)
        for line in self.log_tail.read_new():
            self.logs.append(line)
            self.hosts_seen[line.node_rank] = line.host  # (a scheduler's node learns its host as it starts)
            if line.rank is not None and (said := ranks_said(line)):
                self.ranks_said[line.node_rank] = said
            elif HARDWARE_FAULT in line.text:
                self.faults.setdefault(line.node_rank, []).append(line.text.split(HARDWARE_FAULT, 1)[1].strip())

    def _gpu_sample(self, line: str) -> None:
        sample = sample_of(line)
        if sample is None or not isinstance(sample.get("node"), int):
            return
        mine = self.gpu_samples.setdefault(sample["node"], deque(maxlen=GPU_SAMPLES_SHOWN))
        if mine and (mine[-1].get("t") or 0) >= (sample.get("t") or 0):
            return  # read again (a copy sent twice): the newest is kept once
        mine.append(sample)

    # ---- the snapshot ----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """The run as it stands now."""
        self._read()
        root, plan = self.run.root, self.run.plan
        try:
            self.record_mtime = max((root / "run.json").stat().st_mtime,
                                    _mtime(layout.live_dir(root) / layout.FOLLOWER))
        except OSError:
            pass
        record = self.run.record
        follower = read_json(layout.live_dir(root) / layout.FOLLOWER)
        alive = bool(layout.collector_alive(root))
        now = time.time()
        slow = now - self.slow_at >= SLOW_SECONDS
        if slow:
            self.slow_at = now
            self.exclusions = _exclusions(self.run)
        state, said_nodes = record.state, {}
        # A follower that lives is current, also while it settles the run (its last word says ended)
        # and between two attempts (its word is the last attempt's: the record's nodes are shown).
        if alive and follower.get("attempt") == self.attempt:
            said_nodes = {n.get("node_rank"): n for n in follower.get("nodes") or []}
            if follower.get("run_state") and not state.is_over and not follower.get("ended"):
                state = RunState.parse(follower["run_state"])
        elif not alive and self.scheduler is not None and not state.is_over:
            if slow or self.scheduler_said is None:
                self.scheduler_said = self.scheduler(self.run)
            if self.scheduler_said is not None:
                state = self.scheduler_said.state
                said_nodes = {n.node_rank: n.to_json() for n in self.scheduler_said.nodes}
        live = not state.is_over and (alive or (self.scheduler is not None and self.scheduler_said is not None))
        note, data_until = None, None
        if not state.is_over and not live:
            data_until = follower.get("at") or _mtime(root / "run.json") or None
            stamp = time.strftime("%H:%M:%S", time.localtime(data_until)) if data_until else "its start"
            note = (f"not live: the data stops at {stamp}; the process that collected this run (pid "
                    f"{follower.get('pid', '?')} on {follower.get('host', '?')}) is gone. `fsdpctl status "
                    f"{plan.run_id}` asks its nodes") if follower else (
                    f"not live: no process collects this run (the data stops at {stamp}); "
                    f"`fsdpctl status {plan.run_id}` asks its nodes")
        nodes = self._nodes(record, said_nodes)
        ranks = self._ranks(nodes)
        straggler = self.metrics.straggler()
        if straggler is not None:
            cause = gpu_cause([s for d in self.gpu_samples.values() for s in d], str(straggler.get("host")),
                              straggler.get("local_ranks") or [])
            straggler = {**straggler, "cause": cause} if cause else straggler
        total = plan.train.get("steps") if not plan.command else None
        step = self.metrics.step
        per_step = self.metrics.seconds_per_step()
        eta = (total - step) * per_step if isinstance(total, int) and step is not None and per_step else None
        first = record.attempts[0] if record.attempts else None  # the run's time counts from its first attempt
        started = (first.started_at if first else None) or record.started_at or record.submitted_at
        ended = record.finished_at or record.stopped_at
        elapsed = None
        if started:
            end = epoch(ended) if ended and state.is_over else (data_until or now)
            elapsed = max(0.0, (end or now) - (epoch(started) or now))
        progress = Progress(
            run_id=plan.run_id, profile=plan.profile_name, backend=record.backend, state=str(state),
            attempt=record.attempt, step=step, total_steps=total if isinstance(total, int) else None,
            tokens_per_s=self.metrics.newest("tokens_per_s"), loss=self.metrics.newest("loss"),
            val_loss=self.metrics.val_loss, mfu=self.metrics.newest("mfu"),
            eta_s=None if state.is_over else eta, elapsed_s=elapsed, started_at=started, finished_at=ended,
            exit_code=record.exit_code, live=live, data_until=data_until, note=note,
            first_failure=record.first_failure.headline() if record.first_failure else None,
            loss_history=tuple(self.metrics.series("loss")), tokens_history=tuple(self.metrics.series("tokens_per_s")),
            metrics=self.metrics.rows > 0)
        in_use = {n.host for n in plan.nodes}
        spares = tuple(h.host for h in self.run.profile.spares if h.host not in in_use
                       and h.host not in {e["host"] for e in self.exclusions})
        return Snapshot(taken_at=now, run=progress, nodes=nodes, ranks=ranks, straggler=straggler,
                        attempts=record.attempts, replacements=record.replacements, recovery=record.recovery,
                        resize=record.resize, hosts=HostsNow(spares=spares, excluded=self.exclusions),
                        logs=tuple(self.logs))

    def _nodes(self, record: Any, said: dict[Any, Any]) -> tuple[NodeNow, ...]:
        plan = self.run.plan
        recorded = {n.node_rank: n for n in record.nodes}
        owners = self._owners(said, recorded)
        steps: dict[Any, int] = {}
        for step, entries in self.metrics.windows:
            for entry in entries:
                node = entry.get("node")
                steps[node if node is not None else owners.get(entry.get("rank"), (None,))[0]] = step
        out = []
        hosts = {n.node_rank: n.host for n in plan.nodes}  # none where a scheduler places the nodes
        for rank in _node_ranks_now(plan, recorded):
            mine, kept = said.get(rank) or {}, recorded.get(rank)
            state = mine.get("state") or (str(kept.state) if kept else "unknown")
            ranks = mine.get("ranks") or (kept.ranks if kept else None) or self.ranks_said.get(rank)
            if ranks is None:
                ranks = ranks_in_log(self.run.paths.logs / f"node{rank}.log")
                if ranks is not None:
                    self.ranks_said[rank] = ranks
            host = mine.get("host") or self.hosts_seen.get(rank) or (kept.host if kept else None) or \
                hosts.get(rank) or f"node{rank}"
            sample = self.gpu_samples[rank][-1] if self.gpu_samples.get(rank) else None
            if sample is not None and sample.get("host") not in (None, "", host, hosts.get(rank)):
                sample = None  # another host's (the one a spare replaced)
            out.append(NodeNow(
                node_rank=rank, host=host, state=state, ranks=ranks,
                exit_code=mine.get("exit_code", kept.exit_code if kept else None), step=steps.get(rank),
                gpus=tuple(_gpu(g) for g in (sample or {}).get("gpus") or ()),
                sampled_at=(sample or {}).get("t"), faults=tuple(self.faults.get(rank, ())),
                detail=mine.get("detail") or (kept.detail if kept else None)))
        return tuple(out)

    def _owners(self, said: dict[Any, Any], recorded: dict[int, Any]) -> dict[int, tuple[int, str]]:
        """Global rank -> (node rank, host), from the ranks each node said it holds (a program of the
        user's writes its rows without them)."""
        owners: dict[int, tuple[int, str]] = {}
        for node_rank in _node_ranks_now(self.run.plan, recorded):
            mine, kept = said.get(node_rank) or {}, recorded.get(node_rank)
            text = mine.get("ranks") or (kept.ranks if kept else None) or self.ranks_said.get(node_rank)
            host = mine.get("host") or self.hosts_seen.get(node_rank) or (kept.host if kept else f"node{node_rank}")
            first, _, last = (text or "").partition("-")
            if first.isdigit():
                for rank in range(int(first), int(last if last.isdigit() else first) + 1):
                    owners[rank] = (node_rank, host)
        return owners

    def _ranks(self, nodes: tuple[NodeNow, ...]) -> tuple[RankNow, ...]:
        if not self.metrics.windows:
            return ()
        owners = {}
        for node in nodes:
            first, _, last = (node.ranks or "").partition("-")
            if first.isdigit():
                owners.update({r: (node.node_rank, node.host) for r in range(int(first), int(last or first) + 1)})
        step, newest = self.metrics.windows[-1]
        history: dict[int, list[Optional[float]]] = {}
        for _, entries in self.metrics.windows:
            for entry in entries:
                history.setdefault(entry.get("rank", 0), []).append(_number(entry.get("compute_s")))
        return tuple(RankNow(rank=e.get("rank", 0),
                             node_rank=e.get("node") if e.get("node") is not None else owners.get(e.get("rank"),
                                                                                                  (None, None))[0],
                             host=e.get("host") or owners.get(e.get("rank"), (None, None))[1],
                             local_rank=e.get("local_rank"), step=step, compute_s=_number(e.get("compute_s")),
                             comm_s=_number(e.get("comm_s")), data_s=_number(e.get("data_s")),
                             wall_s=_number(e.get("wall_s")), mem_mb=_number(e.get("mem_mb")),
                             recent_compute_s=tuple(history.get(e.get("rank", 0), ())))
                     for e in newest)


def _gpu(gpu: dict[str, Any]) -> GpuNow:
    faults = []
    if (gpu.get("ecc_uncorrected") or 0) > 0:
        faults.append(f"{gpu['ecc_uncorrected']:.0f} uncorrectable ECC error(s)")
    if gpu.get("remap_pending"):
        faults.append("row remap pending")
    return GpuNow(index=gpu.get("index"), bus_id=gpu.get("bus_id"), sm_mhz=_number(gpu.get("sm_mhz")),
                  sm_max_mhz=_number(gpu.get("sm_max_mhz")), util_pct=_number(gpu.get("util_pct")),
                  mem_mib=_number(gpu.get("mem_mib")), mem_total_mib=_number(gpu.get("mem_total_mib")),
                  temp_c=_number(gpu.get("temp_c")), power_w=_number(gpu.get("power_w")),
                  reasons=tuple(gpu.get("reasons") or ()), faults=tuple(faults))


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0



def _exclusions(run: RunDir) -> tuple[dict[str, Any], ...]:
    """The profile's excluded hosts (fsdpctl's state on this machine), in profile order."""
    from ..hostpool.store import read_exclusions

    found = read_exclusions(run.profile.name)
    hosts = [h.host for h in (*run.profile.hosts, *run.profile.spares)]
    return tuple(found[h].to_json() for h in hosts if h in found)


POLL_SECONDS = 0.2
"""How often a watched run's files are looked at (a few stat calls): a new step shows within this of
landing here."""


def snapshots(live: LiveRun, interval: float = 2.0, *, until_over: bool = True, poll: float = POLL_SECONDS,
              gap: float = 0.0) -> Iterator[Snapshot]:
    """Snapshots of ``live``'s run: one at once, then one whenever something changed (looked at every
    ``poll`` seconds) and at least every ``interval`` seconds, never two within ``gap`` seconds; after
    the one that shows the run over, no more (``until_over=False``: on until the caller stops)."""
    snapshot = live.snapshot()
    yield snapshot
    last = time.monotonic()
    while not (until_over and snapshot.over):
        time.sleep(max(poll, gap - (time.monotonic() - last)))
        if live.changed() or time.monotonic() - last >= interval:
            snapshot = live.snapshot()
            last = time.monotonic()
            yield snapshot


def _node_ranks_now(plan: Any, recorded: dict[int, Any]) -> list[int]:
    """The nodes the run has now: those its record names (a Slurm job's newest step may run on fewer
    nodes than the plan's after an elastic shrink: the node it lost keeps an old log, not a place
    here), else the plan's."""
    return sorted(recorded) or layout.node_ranks(plan)
