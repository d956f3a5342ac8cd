"""Chart data in bounded memory: buckets that merge in pairs keep exact sums, minimums and maximums and
never more than twice their limit; the heat map's columns span the same windows for every rank; a
restarted attempt's steps replace the failed one's; a file too long to read is sampled end to end."""

from __future__ import annotations

import json
import math

from fsdpctl.live import charts, layout
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
    monkeypatch.setattr(charts, "SEED_BYTES", 10_000)
    monkeypatch.setattr(charts, "SAMPLED", 20)
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
