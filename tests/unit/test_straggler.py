"""The straggler rule on per-rank compute times: names a rank that stands out window after window,
and nobody on an even cluster however it jitters."""

from __future__ import annotations

import random

from fsdpctl.workload.straggler import Tally, even_text, slow_ranks, verdict


def windows(n_windows: int, ranks: int, base: float, jitter: float, slow: dict[int, float] | None = None,
            seed: int = 0, ranks_per_node: int = 1) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n_windows):
        out.append([{"rank": r, "node": r // ranks_per_node, "host": f"10.0.0.{r // ranks_per_node + 1}",
                     "compute_s": base * (slow or {}).get(r, 1.0) * (1 + rng.uniform(-jitter, jitter))}
                    for r in range(ranks)])
    return out


def test_an_even_cluster_names_nobody_however_it_jitters():
    for seed in range(50):  # +-4 % jitter per window on 16 ranks: the ratio to the others' median stays < 1.10
        assert verdict(windows(40, 16, 0.050, 0.04, seed=seed)) is None, seed
    text = even_text(windows(40, 16, 0.050, 0.04))
    assert text is not None and text.startswith("ranks even: the slowest rank's compute was 1.0")


def test_one_noisy_window_or_a_few_name_nobody():
    runs = windows(30, 8, 0.05, 0.02)
    for i in (3, 11, 20):  # rank 5 slow in 3 of 30 windows (a checkpoint, a GC pause)
        runs[i][5]["compute_s"] *= 2
    assert verdict(runs) is None
    assert verdict(windows(2, 4, 0.05, 0.0, slow={1: 2.0})) is None  # too few windows to say


def test_a_slow_rank_is_named_with_its_node_host_and_ratio():
    runs = windows(30, 8, 0.05, 0.03, slow={5: 1.4}, ranks_per_node=4)
    found = verdict(runs)
    assert found is not None and found["rank"] == 5 and found["node"] == 1 and found["host"] == "10.0.0.2"
    assert 1.3 < found["ratio"] < 1.5 and found["windows_slow"] == 30 and found["windows"] == 30
    assert found["ranks"] == [5] and found["whole_node"] is None
    assert found["text"].startswith("straggler: rank 5 on 10.0.0.2 (node 1) computed 1.")


def test_a_whole_slow_node_is_named_as_the_node():
    found = verdict(windows(20, 8, 0.05, 0.02, slow={4: 1.5, 5: 1.5, 6: 1.5, 7: 1.5}, ranks_per_node=4))
    # Four of eight slow: the others' median for a slow rank mixes both halves, still >= 1.10x.
    assert found is not None and found["ranks"] == [4, 5, 6, 7] and found["whole_node"] == 1
    assert "node 1 on 10.0.0.2, all 4 of its ranks" in found["text"]


def test_tiny_steps_need_an_absolute_difference_too():
    assert slow_ranks([0.0010, 0.0010, 0.0015]) == {}  # 1.5x, but half a millisecond
    assert list(slow_ranks([0.010, 0.010, 0.015])) == [2]


def test_the_tally_is_the_same_rule_window_by_window():
    runs = windows(25, 4, 0.05, 0.03, slow={2: 1.25})
    tally = Tally()
    for i, window in enumerate(runs):
        tally.add(window)
        if i + 1 < 3:
            assert tally.verdict() is None
    assert tally.verdict() == verdict(runs)
