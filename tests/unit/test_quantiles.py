"""A run's report figures in bounded memory: a figure's values exact while few, then a quantile sketch
whose medians are within ``ERROR`` of the exact ones; the fold of a long run as small as a short one's;
a resume dropping exactly the rows past its step while they are kept one by one; the chart index
keeping all of it."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from fsdpctl.live.chart_index import _Blobs
from fsdpctl.metrics import quantiles
from fsdpctl.metrics.fold import Fold
from fsdpctl.metrics.quantiles import ERROR, EXACT, GAMMA, Values
from fsdpctl.metrics.wait_rule import wait_verdict
from fsdpctl.workload.straggler import even_text, verdict


def within_bound(estimate: float, exact: float) -> bool:
    return abs(estimate - exact) <= ERROR * abs(exact) + 1e-12


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_median_is_exact_while_the_values_are_kept_then_within_the_bound(sign):
    rng = random.Random(7)
    values = [sign * rng.lognormvariate(3.0, 1.5) for _ in range(EXACT)]
    kept = quantiles.of(values)
    assert kept.exact and kept.median() == statistics.median(values)
    for count in (EXACT + 1, 10_000, 200_001):
        more = values + [sign * rng.lognormvariate(3.0, 1.5) for _ in range(count - len(values))]
        sketch = quantiles.of(more)
        assert not sketch.exact and len(sketch) == count
        assert within_bound(sketch.median(), statistics.median(more)), count
        assert sketch.low == min(more) and sketch.newest == more[-1] and sketch.newest_step == count - 1
    sizes = [abs(v) for v in more]  # buckets: the log of the values' range, not their count
    assert len(sketch.positive) + len(sketch.negative) <= math.log(max(sizes) / min(sizes)) / math.log(GAMMA) + 2


def test_consecutive_values_merge_into_the_values_of_them_all_and_survive_the_index():
    rng = random.Random(3)
    parts = [[rng.uniform(0.5, 2.0) for _ in range(n)] for n in (100, 3_000, 7, 5_000)]
    merged = Values.merged([quantiles.of(p) for p in parts])
    everything = [v for p in parts for v in p]
    assert len(merged) == len(everything) and within_bound(merged.median(), statistics.median(everything))
    assert merged.low == min(everything)
    small = Values.merged([quantiles.of(parts[0]), quantiles.of(parts[2])])
    assert small.exact and small.median() == statistics.median(parts[0] + parts[2])
    for values in (merged, small):
        blobs = _Blobs()
        state = json.loads(json.dumps(values.state(blobs.put)))
        back = Values.of_state(state, blobs.arrays)
        assert (back.median(), len(back), back.low, back.newest) == (values.median(), len(values), values.low,
                                                                       values.newest)


def rows(count: int, seed: int = 1, slow_rank: int = 2, width: int = 4) -> list[dict]:
    """Training rows with a window of per-rank timings each; ``slow_rank`` computes ~1.3x longer and
    waits less in collectives in every window."""
    rng = random.Random(seed)
    out = []
    for step in range(1, count + 1):
        ranks = []
        for rank in range(width):
            compute = rng.uniform(0.10, 0.12) * (1.3 if rank == slow_rank else 1.0)
            ranks.append({"rank": rank, "node": rank // 2, "host": f"n{rank // 2}", "wall_s": rng.uniform(0.19, 0.21),
                          "data_s": 0.001, "comm_s": 0.2 - compute, "compute_s": compute, "mem_mb": 100.0,
                          "timing": "hook"})
        out.append({"step": step, "loss": 4.0 / step ** 0.2 + rng.uniform(0, 0.05),
                    "tokens_per_s": rng.lognormvariate(9, 0.2), "mfu": rng.uniform(0.3, 0.4),
                    "step_time_s": rng.uniform(0.19, 0.25), "ranks": ranks})
    return out


def test_a_long_runs_medians_and_straggler_are_within_the_bound_of_the_exact_ones():
    train = rows(5_000)
    figures = Fold.of_rows(train, []).figures()
    for key in ("tokens_per_s", "mfu", "step_time_s"):
        assert within_bound(figures[key], statistics.median(r[key] for r in train)), key
    losses = [r["loss"] for r in train]
    assert figures["final_loss"] == losses[-1] and figures["best_loss"] == min(losses)
    assert figures["steps"] == 5_000 and figures["best_loss_step"] == losses.index(min(losses)) + 1

    windows = [r["ranks"] for r in train]
    exact = wait_verdict(windows)  # the rule over every window kept whole
    assert exact is not None and figures["straggler"]["rank"] == exact["rank"] == 2
    assert figures["straggler"]["windows_slow"] == exact["windows_slow"] and figures["straggler"]["windows"] == 5_000
    assert within_bound(figures["straggler"]["seconds_per_step"], exact["seconds_per_step"])

    computed = [[{k: v for k, v in e.items() if k != "timing"} for e in ranks] for ranks in windows]
    by_compute = Fold.of_rows([{**r, "ranks": c} for r, c in zip(train, computed, strict=True)], []).figures()
    exact = verdict(computed)
    assert by_compute["straggler"]["rank"] == exact["rank"] == 2
    assert within_bound(by_compute["straggler"]["ratio"], exact["ratio"])
    even = [[{**e, "compute_s": 0.1 + 0.001 * e["rank"]} for e in ranks] for ranks in computed]
    text = Fold.of_rows([{**r, "ranks": c} for r, c in zip(train, even, strict=True)], []).figures()["ranks_text"]
    said, exact_text = (float(t.split(" was ")[1].split("x")[0]) for t in (text, even_text(even)))
    assert abs(said - exact_text) <= 0.0100001  # printed to 2 digits: the bound may cross a rounding


def index_bytes(fold: Fold) -> int:
    blobs = _Blobs()
    header = json.dumps(fold.state(blobs.put))
    return len(header) + sum(a.itemsize * len(a) for a in blobs.arrays)


def test_the_fold_of_a_run_ten_times_longer_is_no_larger_and_comes_back_from_the_index_the_same():
    rng = random.Random(5)
    short, long = Fold(), Fold()
    for step in range(1, 200_001):
        row = {"step": step, "loss": rng.uniform(1, 2), "tokens_per_s": rng.lognormvariate(9, 0.3),
               "step_time_s": rng.uniform(0.1, 0.3)}
        long.add("train", row)
        if step <= 20_000:
            short.add("train", row)
    assert index_bytes(long) <= 2 * index_bytes(short), (index_bytes(short), index_bytes(long))
    blobs = _Blobs()
    state = json.loads(json.dumps(long.state(blobs.put)))
    back = Fold()
    back.restore(state, blobs.arrays)
    assert back.figures() == long.figures()


def test_a_resume_drops_exactly_the_rows_past_its_step_while_they_are_kept_one_by_one():
    first, second = rows(1_500, seed=1), rows(1_500, seed=2)
    resumed = Fold.of_rows(first, [])
    resumed.truncate(1_000)  # back into the chunks kept one by one
    for row in second[1_000:]:
        resumed.add("train", row)
    straight = Fold.of_rows(first[:1_000] + second[1_000:], [])
    mine, theirs = resumed.figures(), straight.figures()
    # (each rank's means are the per-rank table's, which cuts its own chunks by share: close, not exact)
    assert [r["rank"] for r in mine.pop("ranks")] == [r["rank"] for r in theirs.pop("ranks")]
    assert mine == theirs

    far = Fold.of_rows(rows(30_000, seed=3), [])
    far.truncate(9_000)  # into a sketch: its counts cut to the share of its steps kept
    assert far.train.rows == pytest.approx(9_000, rel=0.01) and len(far.train.whole()["loss"]) == far.train.rows
    for row in rows(9_100, seed=4)[9_000:]:  # the resumed attempt's rows
        far.add("train", row)
    assert far.figures()["steps"] == 9_100 and len(far.train.whole()["loss"]) == pytest.approx(9_100, rel=0.01)
