"""The live-run model on a run directory written by hand as a collector would: snapshots from the
copies here only (progress, ETA, each node's GPUs now, ranks, the straggler and its GPU's cause, the
newest lines), live while a collector holds the lock and said not to be once it is gone, a later
attempt's rows replacing the failed one's, a program's per-rank rows merged, and nothing read twice."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl.backends import plan_run, render_scripts
from fsdpctl.live import layout
from fsdpctl.live.collector import Collector, attempt_line
from fsdpctl.live.metrics_feed import MetricsFeed
from fsdpctl.live.model import LiveRun
from fsdpctl.live.tails import LineTail, MergedLogTail
from fsdpctl.plan.types import Overrides, overrides_to_json
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.rundir.rundir import create_run
from fsdpctl.rundir.state import NodeState, RunState
from fsdpctl.rundir.status import NodeStatus

PROFILE = ("name: t\nbackend: ssh\nhosts: [10.9.0.1, 10.9.0.2]\nspares: [10.9.0.3]\nnproc_per_node: 1\n"
           "workdir: /scratch/t\ntrain:\n  preset: tiny\n  steps: 100\n")
RUN_ID = "t-20261126-120000-abcd"
HOSTS = ("10.9.0.1", "10.9.0.2")


def new_run(tmp_path: Path):
    profile = parse_profile(PROFILE, "t.yaml")
    inputs = {"profile_source": "t.yaml", "local_python": "/usr/bin/python3", "home": "/home/me",
              "local_cwd": str(tmp_path), "overrides": overrides_to_json(Overrides())}
    plan = plan_run(profile, run_id=RUN_ID, local_run_dir=str(tmp_path / RUN_ID), overrides=Overrides(),
                    **{k: v for k, v in inputs.items() if k != "overrides"})
    run = create_run(plan, profile, render_scripts(plan), PROFILE, inputs)
    run.change(state=RunState.RUNNING, started_at="2026-11-26T12:00:00+00:00", nodes=tuple(
        NodeStatus(node_rank=r, host=h, state=NodeState.RUNNING) for r, h in enumerate(HOSTS)))
    return run


def row(step: int, t: float, slow: float = 1.0, straggler: bool = False) -> str:
    ranks = [{"rank": r, "node": r, "host": HOSTS[r], "local_rank": 0, "compute_s": 0.1 * (slow if r == 1 else 1),
              "comm_s": 0.05, "data_s": 0.001, "wall_s": 0.2, "mem_mb": 500.0} for r in range(2)]
    data = {"kind": "train", "step": step, "loss": 8.0 - step / 100, "tokens_per_s": 1000.0 + step, "mfu": 0.4,
            "time": t, "step_time_s": 0.2, "ranks": ranks, "straggler": None, "straggler_at": None}
    if straggler:
        data["straggler"] = "straggler: rank 1 on 10.9.0.2 (node 1) computed 1.80x the other ranks' median"
        data["straggler_at"] = {"rank": 1, "node": 1, "host": "10.9.0.2", "local_ranks": [0], "ratio": 1.8}
    return json.dumps(data) + "\n"


def gpu_sample(node: int, t: float, slowed: bool = False) -> str:
    gpu = {"index": "0", "bus_id": "00000000:18:00.0", "sm_mhz": 1095.0 if slowed else 1980.0, "sm_max_mhz": 1980.0,
           "temp_c": 60.0, "power_w": 650.0, "util_pct": 98.0, "mem_mib": 60000.0, "mem_total_mib": 81559.0,
           "ecc_uncorrected": 0.0, "remap_pending": False, "reasons": ["HW slowdown"] if slowed else []}
    return json.dumps({"t": t, "node": node, "host": HOSTS[node], "gpus": [gpu]}) + "\n"


def write(path: Path, text: str, mode: str = "a") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open(mode) as handle:
        handle.write(text)


def live(run) -> LiveRun:
    return LiveRun(run, lambda r: MergedLogTail(r.paths.logs / "merged.log", {h: i for i, h in enumerate(HOSTS)}))


def test_a_snapshot_is_made_of_the_copies_here_and_is_live_while_a_collector_holds_the_run(tmp_path):
    run = new_run(tmp_path)
    root, now = run.root, time.time()
    metrics = layout.collected(root, 0, "metrics.jsonl")
    write(metrics, "".join(row(s, now - 50 + s, slow=1.8, straggler=s >= 30) for s in range(10, 41, 10)))
    for node in (0, 1):
        write(layout.collected(root, node, f"gpu/node{node}.jsonl"),
              "".join(gpu_sample(node, now - 10 + i, slowed=node == 1) for i in range(5)))
    write(run.paths.logs / "merged.log", "[10.9.0.1 r0] fsdpctl: global rank 0 on node 0 (torchrun group rank 0)\n"
          "[10.9.0.2] fsdpctl: hardware fault: GPU 0 (00000000:18:00.0) on 10.9.0.2: a memory row remap is pending\n"
          "[10.9.0.1 r0] <script>alert(1)</script> step=40 loss=7.6\n")
    with layout.collector_lock(root):
        Collector(root, run.plan).beat(lambda: [{"node_rank": 0, "host": HOSTS[0], "state": "running"},
                                                         {"node_rank": 1, "host": HOSTS[1], "state": "failed",
                                                          "exit_code": 1, "detail": "rank 1 exited 1"}],
                                       extra={"run_state": "running"})
        snap = live(run).snapshot()
    progress = snap.run
    assert progress.live and progress.note is None and progress.state == "running"
    assert (progress.step, progress.total_steps, progress.loss) == (40, 100, 7.6)
    assert progress.eta_s is not None and abs(progress.eta_s - 60) < 1  # 1 s per step, 60 steps left
    assert progress.tokens_per_s == 1040.0 and progress.mfu == 0.4
    assert [s for s, _ in progress.loss_history] == [10, 20, 30, 40]
    first, second = snap.nodes
    assert (first.host, first.state, first.ranks, first.step) == ("10.9.0.1", "running", "0", 40)
    assert (second.state, second.exit_code, second.detail) == ("failed", 1, "rank 1 exited 1")
    assert second.gpus[0].reasons == ("HW slowdown",) and second.gpus[0].sm_mhz == 1095.0
    assert second.faults and "row remap is pending" in second.faults[0]
    assert [r.compute_s for r in snap.ranks] == pytest.approx([0.1, 0.18]) and len(snap.ranks[1].recent_compute_s) == 4
    assert snap.straggler["rank"] == 1 and "HW slowdown" in snap.straggler["cause"]
    assert snap.hosts.spares == ("10.9.0.3",)
    assert snap.logs[-1].text == "<script>alert(1)</script> step=40 loss=7.6" and snap.logs[-1].rank == 0
    json.dumps(snap.to_json())  # the documented form is plain JSON

    gone = live(run).snapshot()  # nobody holds the collector lock now
    assert not gone.run.live and "not live: the data stops at" in gone.run.note and gone.run.data_until


def test_only_new_bytes_are_read_and_a_later_attempt_replaces_the_failed_ones_rows(tmp_path):
    run = new_run(tmp_path)
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    write(metrics, "".join(row(s, 100.0 + s, slow=1.8, straggler=s > 3) for s in range(1, 51)))
    model = live(run)
    first = model.snapshot()
    assert first.run.step == 50 and model.metrics.rows == 50 and first.straggler["rank"] == 1
    assert not model.changed()  # nothing new since that snapshot
    write(metrics, attempt_line(2, 40) + "".join(row(s, 300.0 + s) for s in range(41, 46)))
    assert model.changed()
    snap = model.snapshot()
    assert model.metrics.rows == 55  # the 50 read before were not read again
    assert snap.run.step == 45 and [s for s, _ in snap.run.loss_history][-6:] == [40, 41, 42, 43, 44, 45]
    assert snap.straggler is None  # the restarted attempt's own rows name nobody (the old one's may be gone)


def test_a_programs_per_rank_rows_are_merged_once_every_rank_is_in():
    feed = MetricsFeed(world_size=2)
    feed.add_lines([json.dumps({"step": 1, "rank": 0, "loss": 4.0, "step_time_s": 0.1})])
    assert feed.step is None  # rank 1's row of step 1 is not in yet
    feed.add_lines([json.dumps({"step": 1, "rank": 1, "loss": 2.0, "step_time_s": 0.3})])
    assert feed.step == 1 and feed.newest("loss") == 3.0 and feed.world == 2
    for step in range(2, 6):
        feed.add_lines([json.dumps({"step": step, "rank": r, "loss": 1.0, "step_time_s": 0.1 * (3 if r else 1)})
                        for r in (0, 1)])
    assert feed.straggler()["rank"] == 1  # the rule over the merged windows: rank 1 computes 3x
    feed.add_lines(["not json", json.dumps({"no": "step"}), json.dumps({"step": 1, "rank": 0, "loss": 4.0,
                                                                         "step_time_s": 0.1})])
    assert feed.skipped == 2 and feed.rows == 5  # the same line again is not a row again


def test_a_line_tail_gives_complete_lines_starts_near_the_end_and_notices_a_new_file(tmp_path):
    path = tmp_path / "f.log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)) + "half")
    tail = LineTail(path, start_back=100)
    first = tail.read()
    assert first[-1] == "line 999" and len(first) < 20 and all(x.startswith("line ") for x in first)
    with path.open("a") as handle:
        handle.write(" done\n")
    assert tail.read() == ["half done"]
    path.write_text("new\n")
    assert tail.read() == ["new"] and tail.began_again


def test_a_programs_rows_without_nodes_are_placed_by_the_ranks_each_node_said_it_holds(tmp_path):
    run = new_run(tmp_path)
    rows = "".join(json.dumps({"step": s, "rank": r, "loss": 1.0, "step_time_s": 0.1 * (1 + r)}) + "\n"
                   for s in range(1, 6) for r in (0, 1))
    write(layout.collected(run.root, 0, "metrics.jsonl"), rows)
    write(run.paths.logs / "merged.log", "[10.9.0.1 r0] fsdpctl: global rank 0 on node 0 (torchrun group rank 0)\n"
          "[10.9.0.2 r1] fsdpctl: global rank 1 on node 1 (torchrun group rank 1)\n")
    snap = live(run).snapshot()
    assert [(r.rank, r.node_rank, r.host) for r in snap.ranks] == [(0, 0, "10.9.0.1"), (1, 1, "10.9.0.2")]
    assert [n.step for n in snap.nodes] == [5, 5]


@given(st.lists(st.one_of(st.tuples(st.integers(0, 5), st.integers(0, 12)), st.just("attempt")), max_size=80))
@settings(max_examples=200, deadline=None)
def test_the_rank_furthest_behind_is_kept_as_the_rows_and_attempts_come(events):
    """The feed counts again only when the last rank at the lowest step moves on; whatever the order
    of the rows (and of a later attempt's start), it holds what counting every time gives."""
    feed = MetricsFeed(world_size=None)
    feed.hold = True  # rows stay pending: only the bookkeeping is under test
    for event in events:
        if event == "attempt":
            feed._attempt_began(0)
            continue
        rank, step = event
        feed._rank_row({"step": step, "rank": rank, "loss": 1.0})
        expected = min(feed.rank_newest.get(r, -1) for r in feed.ranks_seen)
        assert feed.behind == expected
        assert feed.at_behind == [feed.rank_newest.get(r, -1) for r in feed.ranks_seen].count(expected)


def test_the_view_shows_the_nodes_the_record_names_now_not_a_lost_nodes_old_log(tmp_path):
    """A Slurm job whose newest step runs on fewer nodes after an elastic shrink: its record names the
    nodes it has now (node 0); node 1's log and GPU samples stay behind, and the view leaves it out."""
    run = new_run(tmp_path)
    write(run.paths.logs / "merged.log", "[10.9.0.1 r0] fsdpctl: global rank 0 on node 0 (torchrun group rank 0)\n"
          "[10.9.0.2 r1] fsdpctl: global rank 1 on node 1 (torchrun group rank 1)\n")
    write(layout.collected(run.root, 1, "gpu/node1.jsonl"), gpu_sample(1, time.time() - 60))
    assert [n.node_rank for n in live(run).snapshot().nodes] == [0, 1]
    run.change(nodes=(NodeStatus(node_rank=0, host=HOSTS[0], state=NodeState.RUNNING),))
    assert [(n.node_rank, n.host) for n in live(run).snapshot().nodes] == [(0, "10.9.0.1")]
