"""Chart data in bounded memory: buckets that merge in pairs keep exact sums, minimums and maximums and
never more than twice their limit; the heat map's columns span the same windows for every rank; a
restarted attempt's steps replace the failed one's; a file too long to read is sampled end to end."""

from __future__ import annotations

import json
import math

from fsdpctl.live import chart_series, copies, layout
from fsdpctl.live.charts import Buckets, ChartStore, HeatMap
from fsdpctl.live.collector import attempt_line
from tests.unit.test_live_model import gpu_sample, new_run, row, write


def test_buckets_merge_in_pairs_and_keep_exact_figures():
    series = Buckets(limit=10)
    for x in range(1000):
        series.add(x, float(x))
    assert len(series.x) < 20 and series.width == 64
    assert sum(series.count) == 1000 and math.isclose(sum(series.total), sum(range(1000)))
    assert series.low[0] == 0 and series.high[-1] == 999 and list(series.x) == sorted(series.x)
    data = series.to_json(extremes=True)
    assert len(data["x"]) == len(data["y"]) == len(data["low"])
    gaps = Buckets(limit=10)
    gaps.add(1, None)
    gaps.add(2, 5.0)
    assert gaps.to_json()["y"] == [None, 5.0]


def test_the_heat_maps_columns_span_the_same_windows_for_every_rank():
    heat = HeatMap(limit=4)
    for step in range(1, 101):
        heat.add(step, [{"rank": r, "node": r // 2, "host": f"h{r // 2}", "compute_s": 1.0 + r} for r in range(4)])
    data = heat.to_json()
    assert len(data["steps"]) < 8 and data["windows_per_column"] >= 16
    assert [r["compute_s"][0] for r in data["ranks"]] == [1.0, 2.0, 3.0, 4.0]  # means: exact per rank
    heat.drop_after(50)
    assert all(step <= 50 for step in heat.steps)


def test_a_run_written_here_becomes_charts_and_a_restart_replaces_the_steps_it_trains_again(tmp_path):
    run = new_run(tmp_path)
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    write(metrics, "".join(row(s, 1000.0 + s, slow=1.8) for s in range(1, 31)))
    samples = "".join(gpu_sample(1, 1000.0 + i, i > 5) for i in range(10))
    write(layout.collected(run.root, 1, "gpu/node1.jsonl"), samples)
    store = ChartStore(run.root, run.plan, 2)
    assert store.update()
    data = store.to_json()
    assert data["train"]["loss"]["x"] == list(range(1, 31))
    assert [r["rank"] for r in data["heat"]["ranks"]] == [0, 1] and data["heat"]["ranks"][1]["compute_s"][0] == 0.18
    gpu = data["gpus"][0]
    assert (gpu["node"], gpu["gpu"], gpu["sm_max_mhz"]) == (1, "0", 1980.0)
    assert gpu["slowed"]["y"] == [0.0] * 6 + [1.0] * 4 and gpu["sm_mhz"]["y"][-1] == 1095.0
    assert len(data["rank_time"]) == 2 and data["rank_time"][0]["x"][0] == 1001.0
    assert not store.update()  # nothing new
    write(metrics, attempt_line(2, 20) + "".join(row(s, 2000.0 + s) for s in range(21, 26)))
    store.update()
    steps = store.to_json()["train"]["loss"]["x"]
    assert steps == list(range(1, 26))  # 21-30 of the failed attempt gone, 21-25 of the next one in
    json.dumps(store.to_json())


def test_a_file_too_long_to_read_is_sampled_end_to_end_then_followed(tmp_path, monkeypatch):
    monkeypatch.setattr(copies, "SEED_BYTES", 10_000)
    monkeypatch.setattr(copies, "SAMPLED", 20)
    run = new_run(tmp_path)
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    write(metrics, "".join(row(s, 1000.0 + s) for s in range(1, 401)))
    store = ChartStore(run.root, run.plan, 2)
    store.update()
    steps = store.to_json()["train"]["loss"]["x"]
    assert 15 <= len(steps) <= 20 and steps == sorted(steps) and steps[0] < 30 and steps[-1] > 370
    write(metrics, row(401, 1401.0))
    store.update()
    assert store.to_json()["train"]["loss"]["x"][-1] == 401  # what comes next is read whole


def _program_row(step: int, rank: int) -> str:
    """A user program's own row, one per rank: merged only once every rank's row of its step is in."""
    return json.dumps({"step": step, "rank": rank, "loss": 5.0 - step / 50 + rank / 1000, "step_time_s": 0.2}) + "\n"


def _three_ways(run, more) -> dict:
    """Keep an index, let the files grow (``more()``), then read the charts from the index, from the files
    alone, and with the index deleted: all three the same. The charts' data, as read whole."""
    writer = ChartStore(run.root, run.plan, 2)
    writer.update()
    assert writer.save_index() and writer.index_path.is_file()
    more()
    whole = ChartStore(run.root, run.plan, 2, use_index=False)
    whole.update()
    expected = whole.to_json()
    from_index = ChartStore(run.root, run.plan, 2)
    from_index.update()
    assert from_index.index_loaded and not whole.index_loaded
    assert from_index.to_json() == expected
    writer.index_path.unlink()
    rebuilt = ChartStore(run.root, run.plan, 2)
    rebuilt.update()
    assert not rebuilt.index_loaded and rebuilt.to_json() == expected
    return expected


def test_the_chart_index_gives_the_same_charts_as_the_files_read_whole(tmp_path, monkeypatch):
    """The index kept with a line half written, GPU samples, and buckets already merged; then more rows,
    a restart and more samples: the same charts from the index as from the files. A replaced file makes
    the index stale, and it is not used."""
    monkeypatch.setattr(chart_series, "POINTS", 8)  # the buckets merge in pairs inside what the index holds
    run = new_run(tmp_path)
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    samples = layout.collected(run.root, 1, "gpu/node1.jsonl")
    write(metrics, "".join(row(s, 1000.0 + s, slow=1.8) for s in range(1, 41)))
    write(samples, "".join(gpu_sample(1, 1000.0 + i, i % 7 == 0) for i in range(30)))
    cut = row(41, 1041.0)
    write(metrics, cut[:40])  # a line still being written when the index is kept

    def more():
        write(metrics, cut[40:] + "".join(row(s, 1000.0 + s) for s in range(42, 61)) + attempt_line(2, 50) +
              "".join(row(s, 3000.0 + s) for s in range(51, 71)))
        write(samples, "".join(gpu_sample(1, 1030.0 + i, i % 5 == 0) for i in range(30)))

    expected = _three_ways(run, more)
    loss = expected["train"]["loss"]["x"]
    assert loss[0] == 1 and 60 < loss[-1] <= 70 and len(loss) <= 8  # 70 steps in merged buckets
    assert len(expected["heat"]["ranks"]) == 2
    assert sum(expected["gpus"][0]["slowed"]["y"]) > 0

    store = ChartStore(run.root, run.plan, 2)
    store.update()
    store.save_index()
    replaced = samples.with_name("new.jsonl")
    replaced.write_text(gpu_sample(1, 5000.0))
    replaced.rename(samples)  # another file under the name: the index tells of the one before
    stale = ChartStore(run.root, run.plan, 2)
    stale.update()
    assert not stale.index_loaded and stale.to_json()["gpus"][0]["sm_mhz"]["x"] == [5000.0]


def test_the_chart_index_keeps_a_programs_rows_still_waiting_for_their_step(tmp_path):
    """A user program's rows, one per rank (two ranks of one node): the index is kept with step 11's
    rank 0 row in and its rank 1 row to come, so only the row the index keeps can merge that step."""
    run = new_run(tmp_path)
    copy = layout.collected(run.root, 0, "metrics.jsonl")
    write(copy, "".join(_program_row(s, r) for s in range(1, 11) for r in (0, 1)) + _program_row(11, 0))

    def more():
        write(copy, _program_row(11, 1) + "".join(_program_row(s, r) for s in range(12, 15) for r in (0, 1)))

    expected = _three_ways(run, more)
    assert expected["train"]["loss"]["x"] == list(range(1, 15))
    assert expected["train"]["loss"]["y"][10] == round(5.0 - 11 / 50 + 0.0005, 6)  # both ranks' mean


def test_a_page_brings_its_first_nodes_curves_and_the_rest_on_demand(tmp_path):
    run = new_run(tmp_path)
    write(layout.collected(run.root, 0, "metrics.jsonl"), "".join(row(s, 1000.0 + s) for s in range(1, 11)))
    for node in (0, 1):
        write(layout.collected(run.root, node, f"gpu/node{node}.jsonl"), "".join(gpu_sample(node, 1000.0 + i)
                                                                                  for i in range(5)))
    store = ChartStore(run.root, run.plan, 2)
    store.update()
    page = store.to_json(nodes=[0], page=True)
    assert [n["node"] for n in page["nodes"]] == [0, 1] and [n["gpus"] for n in page["nodes"]] == [1, 1]
    assert {g["node"] for g in page["gpus"]} == {0} and {r["rank"] for r in page["rank_time"]} == {0}
    assert set(page["gpus"][0]) == {"node", "host", "gpu", "sm_max_mhz", "sm_mhz", "slowed"}
    assert set(page["gpus"][0]["slowed"]) == {"y"}  # the SM clock's times serve both
    later = store.node_json(1, page=True)
    assert {g["node"] for g in later["gpus"]} == {1} and [r["rank"] for r in later["rank_time"]] == [1]


def test_report_from_the_chart_index_says_what_report_from_the_files_says(tmp_path):
    """A finished run (the collector's copies whole: a straggler, a slowed GPU, a restart that resumed
    from step 25, validation rows, a loss that went NaN once): ``report`` from its chart index, plus the
    rows written after the index was kept, and from the files alone give the same summary; with the
    index deleted it reads the files again."""
    from fsdpctl.api.run import Run
    from fsdpctl.api.summaries import _indexed, report_of, run_series
    from fsdpctl.rundir.rundir import load_run
    from fsdpctl.rundir.state import RunState

    run = new_run(tmp_path)
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    write(metrics, "".join(row(s, 1000.0 + s, slow=1.8, straggler=s > 20) for s in range(1, 31)))
    write(metrics, json.dumps({"kind": "val", "step": 20, "val_loss": 7.5}) + "\n")
    for node in (0, 1):
        write(layout.collected(run.root, node, f"gpu/node{node}.jsonl"),
              "".join(gpu_sample(node, 1000.0 + i, slowed=node == 1 and i > 3) for i in range(12)))
    store = ChartStore(run.root, run.plan, 2)
    store.update()
    assert store.save_index()
    nan_row = json.loads(row(27, 2027.0))
    nan_row["loss"] = float("nan")
    write(metrics, attempt_line(2, 25) + "".join(row(s, 2000.0 + s, slow=1.8) for s in range(26, 41)).replace(
        row(27, 2027.0, slow=1.8), json.dumps(nan_row) + "\n"))
    write(layout.live_dir(run.root) / "collect.json", "{}")
    run.change(state=RunState.SUCCEEDED, finished_at="2026-11-26T13:00:00+00:00", exit_code=0, logs_complete=True)
    handle = Run(load_run(run.root))

    assert _indexed(handle) is not None and _indexed(handle).index_loaded
    from_index = report_of([handle], fetch=False)
    _, files_summary = run_series(handle, fetch=False, rows=True)
    index_summary = from_index.summaries[0]
    assert index_summary.to_json() == files_summary.to_json()
    assert index_summary.steps == 40 and index_summary.straggler["rank"] == 1
    assert index_summary.final_val_loss == 7.5 and "HW slowdown" in " ".join(index_summary.gpus)
    assert "HW slowdown" in index_summary.straggler.get("cause", "")
    assert not from_index.series[0].train  # the rows were not read

    store.index_path.unlink()
    assert _indexed(handle) is None
    assert report_of([handle], fetch=False).summaries[0].to_json() == files_summary.to_json()


def test_a_programs_rows_from_every_nodes_copy_read_in_turn_merge_into_whole_steps(tmp_path, monkeypatch):
    """Each node's copy holds its rank's rows; read one copy after the other, every step still comes out
    once, with every rank in it (a rank ahead of the others is not a step given up on), the same as the
    files read whole; a rank that stops writing holds nothing back once every other rank has moved on."""
    from fsdpctl.live.metrics_feed import MetricsFeed
    from fsdpctl.metrics.rows import read_rows

    ranks = 4
    copies = [[_program_row(s, r) for s in range(1, 21)] for r in range(ranks)]
    merged: list[dict] = []
    feed = MetricsFeed(ranks, on_row=lambda kind, row: merged.append(row))
    for batch in range(0, 20, 5):  # four reads, each taking every copy's new rows in turn
        for rank in range(ranks):
            feed.add_lines(copies[rank][batch:batch + 5])
    assert [r["step"] for r in merged] == list(range(1, 21))
    assert all(len(r["ranks"]) == ranks for r in merged)
    whole = read_rows([line for copy in copies for line in copy], "x").train
    assert [r["loss"] for r in merged] == [r["loss"] for r in whole]

    from fsdpctl.live import metrics_feed

    gone = MetricsFeed(2, on_row=lambda kind, row: merged.append(row))
    merged.clear()
    gone.add_lines([_program_row(1, 0), _program_row(1, 1), _program_row(2, 0)])  # rank 1 stops at step 1
    gone.add_lines([_program_row(s, 0) for s in range(3, 10)])
    assert [r["step"] for r in merged] == [1]  # 2-9 wait for rank 1 (PENDING_SECONDS)
    monkeypatch.setattr(metrics_feed, "PENDING_SECONDS", 0.0)  # ... and then go without it
    gone.add_lines([_program_row(10, 0)])
    assert merged[0]["step"] == 1 and len(merged[0]["ranks"]) == 2
    assert [r["step"] for r in merged[1:4]] == [2, 3, 4] and len(merged[1]["ranks"]) == 1


def _attempted_copy(rank: int) -> list[str]:
    """A node's copy of its rank's own rows: attempt 1 reached step 10, attempt 2 resumed from 5 and
    reached step 8 (its rows' losses told apart by a tenth)."""
    old = [_program_row(s, rank) for s in range(1, 11)]
    new = [json.dumps({"step": s, "rank": rank, "loss": 9.1, "step_time_s": 0.2}) + "\n" for s in range(6, 9)]
    return [*old, attempt_line(2, 5), *new]


def test_each_copys_attempt_line_applies_to_its_own_rows_read_whole_or_in_turn(tmp_path, monkeypatch):
    """What attempt 1 trained past step 5 is gone from every copy, whichever copy is read first, and what
    attempt 2 trained is kept: steps 1-8, each with both ranks."""
    from fsdpctl.metrics.rows import read_copies

    whole = read_copies([_attempted_copy(0), _attempted_copy(1)], "x").train
    assert [r["step"] for r in whole] == list(range(1, 9))
    assert all(len(r["ranks"]) == 2 for r in whole) and [r["loss"] for r in whole[5:]] == [9.1] * 3
    run = new_run(tmp_path)
    for rank in (0, 1):
        write(layout.collected(run.root, rank, "metrics.jsonl"), "".join(_attempted_copy(rank)))
    monkeypatch.setattr(copies, "CHUNK_BYTES", 200)  # a few rows of each copy at a time, in turn
    store = ChartStore(run.root, run.plan, 2)
    store.update()
    assert store.to_json()["train"]["loss"]["x"] == list(range(1, 9))
    assert store.to_json()["train"]["loss"]["y"][5:] == [9.1] * 3


def test_a_report_reads_a_long_gpu_file_whole(tmp_path):
    run = new_run(tmp_path)
    samples = layout.collected(run.root, 1, "gpu/node1.jsonl")
    write(samples, "".join(gpu_sample(1, 1000.0 + i, slowed=i >= 29_990) for i in range(30_000)))
    assert samples.stat().st_size > 8 << 20  # more than one read takes
    store = ChartStore(run.root, run.plan, 2, sources=([], [samples]), whole=True)
    store.update()
    assert store.last_sample[(1, "10.9.0.2")] == 1000.0 + 29_999
    assert store.to_json()["gpus"][0]["slowed"]["y"][-1] > 0  # the slowdown at its very end is in
