"""A launch's timeline: spans per node, moments from lines, merged across processes, shown in order."""

from __future__ import annotations

import time

from fsdpctl.rundir.lines import LogLine
from fsdpctl.rundir.timeline import LineMoments, Timeline, process_started, render, rows


def test_a_phase_is_done_when_its_slowest_node_is_and_the_views_name_it():
    line = Timeline(origin=1000.0)
    line.begin("startup", at=1000.0)
    line.end("startup", at=1001.0)
    for node, (a, b) in {0: (1001.0, 1001.5), 1: (1001.0, 1003.0), 2: (1001.2, 1001.4)}.items():
        line.begin("connect", node, at=a)
        line.end("connect", node, at=b)
    found = rows(line.to_json())
    assert [r["phase"] for r in found] == ["startup", "connect"]
    connect = found[1]
    assert (connect["begin"], connect["done"], connect["added"]) == (1.0, 3.0, 2.0)
    assert (connect["slowest_node"], connect["fastest_node"], connect["nodes"]) == ("1", "2", 3)
    text = render(found, {"1": "gpu-b", "2": "gpu-c"})
    assert "node 2 (gpu-c) 1.40 s .. node 1 (gpu-b) 3.00 s" in text[2]


def test_rows_come_in_the_launchs_order_whatever_order_they_were_timed_in():
    line = Timeline(origin=0.0)
    for phase, at in (("first_step", 9.0), ("agents", 3.0), ("plan", 1.0), ("rendezvous", 5.0)):
        line.reached(phase, 0 if phase != "plan" else "launcher", at=at)
    assert [r["phase"] for r in rows(line.to_json())] == ["plan", "agents", "rendezvous", "first_step"]


def test_two_processes_parts_merge_into_one_timeline():
    """The launcher times the start; the run's collector (another process, another origin) the lines."""
    launcher = Timeline(origin=100.0)
    launcher.begin("plan", at=100.0)
    launcher.end("plan", at=101.0)
    collector = Timeline(origin=102.0)
    collector.reached("torchrun", 0, at=103.0)
    merged = Timeline.from_json(collector.merged(Timeline.from_json(launcher.to_json())).to_json())
    assert merged.origin == 100.0
    assert merged.spans["plan"]["launcher"] == [0.0, 1.0] and merged.spans["torchrun"]["0"] == [3.0, 3.0]
    again = merged.merged(merged)  # merging the same twice changes nothing
    assert again.to_json() == merged.to_json()


def test_line_moments_mark_a_nodes_torchrun_rendezvous_first_line_step_and_last_line():
    line = Timeline(origin=0.0)
    moments = LineMoments(line)
    moments.saw(1, [LogLine(1, "h", "fsdpctl: node 1 of 2 on h in /w")], at=1.0)
    moments.saw(1, [LogLine(1, "h", "W1126 torchrun warning")], at=1.5)  # torchrun's own: no rank yet
    moments.saw(1, [LogLine(1, "h", "fsdpctl: global ranks 2-3 on node 1 (torchrun group rank 1)", rank=2)], at=2.0)
    moments.saw(1, [LogLine(1, "h", "hello", rank=2), LogLine(1, "h", "x step=5 loss=1.0", rank=2)], at=3.0)
    moments.saw(1, [LogLine(1, "h", "validation step=5 val_loss=1.0", rank=2)], at=4.0)
    moments.saw(1, [LogLine(1, "h", "bye", rank=3)], at=6.0)
    spans = line.spans
    assert spans["torchrun"]["1"] == [1.0, 1.0] and spans["rendezvous"]["1"] == [2.0, 2.0]
    assert spans["first_line"]["1"] == [3.0, 3.0] and spans["first_step"]["1"] == [3.0, 3.0]
    assert spans["last_line"]["1"] == [6.0, 6.0]


def test_a_users_program_without_fsdpctls_rank_start_still_marks_its_ranks_start():
    line = Timeline(origin=0.0)
    LineMoments(line).saw(0, [LogLine(0, "h", "epoch 1", rank=0)], at=2.0)
    assert line.spans["rendezvous"]["0"] == [2.0, 2.0] and "first_step" not in line.spans


def test_this_process_start_is_before_now():
    started = process_started()
    assert started is not None and time.time() - 3600 * 24 < started <= time.time()
