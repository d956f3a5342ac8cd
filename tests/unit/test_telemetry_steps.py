"""The rank telemetry's pure parts: where a step ends, the windows each rank writes, their merge into
windows every rank shares, and the straggler rule for ranks timed from outside their program."""

from __future__ import annotations

import threading

from fsdpctl.metrics.rank_windows import merge_all
from fsdpctl.metrics.rows import read_rows
from fsdpctl.metrics.wait_rule import ranks_even_text, straggler_verdict, window_culprit
from fsdpctl.node.telemetry.steps import Step, StepTracker
from fsdpctl.node.telemetry.windows import Windows, window_row


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tracker() -> tuple[StepTracker, Clock]:
    clock = Clock()
    return StepTracker(lambda losses: float(sum(losses)), clock=clock), clock


def test_a_step_ends_at_the_outermost_optimizer_step_after_a_backward():
    steps, clock = tracker()
    opt, inner_a, inner_b = object(), object(), object()
    # a plain step: data, backward, step
    steps.data(0.5, tokens=64)
    clock.now = 1.0
    steps.backward_called(2.0)
    steps.optimizer_starts(opt)
    assert steps.optimizer_ended(opt).number == 1
    # an optimizer container: the inner steps are no steps of their own (torchtitan: N+1 calls)
    steps.backward_called(3.0)
    steps.optimizer_starts(opt)
    for inner in (inner_a, inner_b):
        steps.optimizer_starts(inner)
        assert steps.optimizer_ended(inner) is None
    clock.now = 3.0
    second = steps.optimizer_ended(opt)
    assert (second.number, second.wall_s, second.loss, second.backward) == (2, 2.0, 3.0, 1)
    # gradient accumulation: three backward calls, one step, the loss their sum
    for loss in (0.25, 0.25, 0.5):
        steps.backward_called(loss)
    steps.optimizer_starts(opt)
    third = steps.optimizer_ended(opt)
    assert (third.backward, third.loss) == (3, 1.0)
    # an optimizer step without a backward since the last one: no step
    steps.optimizer_starts(opt)
    assert steps.optimizer_ended(opt) is None
    assert [s.number for s in steps.done] == [1, 2, 3]
    first = steps.done[0]
    assert (first.data_s, first.tokens, first.wall_s) == (0.5, 64, 1.0)


def test_steps_inside_backward_and_inside_a_closure_count_once_per_backward():
    steps, _ = tracker()
    opt = object()
    for _ in range(2):  # optimizer-in-backward: a step per parameter while backward runs
        steps.backward_called(1.0)
        for _param in range(4):
            steps.optimizer_starts(opt)
            steps.optimizer_ended(opt)
    assert steps.number == 2
    steps.optimizer_starts(opt)  # Lightning: step(closure), forward and backward inside the step
    steps.backward_called(1.0)
    assert steps.optimizer_ended(opt).number == 3


def test_a_step_that_raised_leaves_no_stale_entry_behind():
    steps, _ = tracker()
    outer, inner = object(), object()
    steps.backward_called(1.0)
    steps.optimizer_starts(outer)
    steps.optimizer_starts(inner)  # raised: no post hook for either
    steps.backward_called(1.0)
    steps.optimizer_starts(outer)
    assert steps.optimizer_ended(outer).number == 1


def test_a_step_the_scaler_skipped_is_dropped_and_only_the_training_thread_counts():
    steps, clock = tracker()
    opt = object()
    steps.backward_called(8.0)
    clock.now = 5.0
    steps.scaler_stepped(number_before=0)  # inf found: no optimizer step
    assert steps.skipped == 1
    steps.comm(1.0)
    other = threading.Thread(target=lambda: (steps.comm(9.0), steps.data(9.0, 9), steps.backward_called(9.0)))
    other.start()
    other.join()
    steps.backward_called(1.0)
    clock.now = 6.0
    steps.optimizer_starts(opt)
    step = steps.optimizer_ended(opt)
    assert (step.number, step.loss, step.wall_s, step.comm_s, step.data_s, step.backward) == (1, 1.0, 1.0, 1.0, 0, 1)


def test_set_up_collectives_before_the_first_step_are_no_steps():
    steps, _ = tracker()
    steps.comm(3.0)  # init_process_group's barrier, a broadcast of the model
    steps.backward_called(1.0)
    steps.optimizer_starts(steps)
    assert steps.optimizer_ended(steps).comm_s == 0.0


def make_step(number: int, wall: float = 0.1, **fields) -> Step:
    values = dict(ended=float(number), wall_s=wall, data_s=0.01, comm_s=0.03, backward=1, loss=1.0, tokens=0)
    values.update(fields)
    return Step(number=number, **values)


def test_windows_end_where_every_rank_can_end_one_and_grow_to_about_a_second():
    windows = Windows(target_s=1.0)
    ends = [w[-1].number for n in range(1, 200) for w in windows.add(make_step(n, wall=0.1))]
    assert ends[:5] == [1, 2, 3, 5, 9]
    widths = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    assert sorted(set(widths)) == [1, 2, 4, 8, 16]  # 0.1 s steps: a window of 16 is the first to last a second
    assert all((end - 1) % width == 0 for end, width in zip(ends[1:], widths, strict=True))
    slow = Windows(target_s=1.0)
    assert [w[-1].number for n in range(1, 6) for w in slow.add(make_step(n, wall=2.0))] == [1, 2, 3, 4, 5]
    assert [s.number for s in windows.rest()] == list(range(194, 200))


def test_a_window_row_is_per_step_and_leaves_out_what_was_not_seen():
    steps = [make_step(2, wall=0.2, tokens=100), make_step(3, wall=0.4, tokens=100)]
    row = window_row(steps, [1.0, 3.0], {"rank": 1, "node": 0, "host": "n1"}, comm_seen=True, extra={"x": 1})
    assert row["step"] == 3 and row["steps"] == 2 and row["rank"] == 1 and row["x"] == 1
    assert row["wall_s"] == 0.3 and row["comm_s"] == 0.03 and row["compute_s"] == 0.26 and row["loss"] == 2.0
    assert row["tokens_per_s"] == round(200 / 0.6, 1)
    hidden = window_row(steps, [None, None], {"rank": 1}, comm_seen=False, extra={})
    assert "comm_s" not in hidden and "compute_s" not in hidden and "loss" not in hidden


def hook_row(rank: int, step: int, steps: int, **fields) -> dict:
    row = {"step": step, "steps": steps, "rank": rank, "node": rank, "host": f"n{rank + 1}", "kind": "train",
           "source": "hook", "wall_s": 0.1, "data_s": 0.01, "comm_s": 0.04, "compute_s": 0.05, "loss": 2.0,
           "attempt": 1}
    row.update(fields)
    return row


def test_ranks_with_different_windows_are_merged_at_the_ends_they_share():
    rank0 = [hook_row(0, 1, 1), hook_row(0, 3, 2, loss=1.0), hook_row(0, 5, 2, loss=3.0, wall_s=0.3)]
    rank1 = [hook_row(1, 1, 1), hook_row(1, 5, 4, loss=4.0, tokens_per_s=100.0)]
    merged = merge_all(rank0 + rank1)
    assert [(m["step"], m["steps"]) for m in merged] == [(1, 1), (5, 4)]
    window = merged[1]
    assert [e["rank"] for e in window["ranks"]] == [0, 1]
    assert window["ranks"][0]["wall_s"] == 0.2 and window["ranks"][1]["wall_s"] == 0.1
    assert window["loss"] == (2.0 + 4.0) / 2  # rank 0's two rows weighted by their steps, then the ranks' mean
    assert window["tokens_per_s"] == 100.0 and window["step_time_s"] == 0.15
    # a newer attempt counts its steps from 1 again: its rows alone stand; a row read twice counts once
    again = merge_all(rank0 + rank1 + [hook_row(0, 1, 1, attempt=2), hook_row(1, 1, 1, attempt=2),
                                       hook_row(1, 1, 1, attempt=2)])
    assert [(m["step"], len(m["ranks"])) for m in again] == [(1, 2)]


def test_the_report_reads_hook_rows_beside_a_programs_own():
    lines = [json_line(r) for r in (hook_row(0, 1, 1), hook_row(1, 1, 1), hook_row(0, 2, 1), hook_row(1, 2, 1))]
    lines.append(json_line({"step": 2, "loss": 9.0, "lr": 0.1}))  # the program's own row of step 2
    series = read_rows(lines, "run")
    assert [r["step"] for r in series.train] == [1, 2]
    assert series.train[1]["loss"] == 9.0 and series.train[1]["lr"] == 0.1 and len(series.train[1]["ranks"]) == 2
    assert series.world == 2


def json_line(row: dict) -> str:
    import json

    return json.dumps(row)


def ranks_window(**changes) -> list[dict]:
    """Four ranks of an even window (0.1 s steps), then ``changes``: rank -> its figures."""
    window = [{"rank": r, "timing": "hook", "wall_s": 0.1, "data_s": 0.002, "comm_s": 0.04 + 0.001 * r,
               "compute_s": 0.058 - 0.001 * r, "host": f"n{r + 1}", "node": r} for r in range(4)]
    for rank, fields in changes.items():
        window[int(rank[1:])].update(fields)
    return window


def test_the_rank_that_waited_least_is_named_with_its_cause():
    slow_input = ranks_window(r2={"data_s": 0.032, "comm_s": 0.01})
    assert window_culprit(slow_input)[:2] == (2, "input")
    slow_compute = ranks_window(r1={"compute_s": 0.088, "comm_s": 0.01})
    assert window_culprit(slow_compute)[:2] == (1, "compute")
    verdict = straggler_verdict([slow_input] * 4 + [ranks_window()])
    assert verdict["rank"] == 2 and verdict["slow_in"] == "input" and verdict["windows_slow"] == 4
    assert verdict["host"] == "n3" and "every rank waits for it" in verdict["text"] and "input" in verdict["text"]
    assert straggler_verdict([slow_compute] * 5)["slow_in"] == "compute"


def test_an_even_run_and_a_stray_window_name_nobody():
    even = [ranks_window() for _ in range(6)]
    assert window_culprit(even[0]) is None and straggler_verdict(even) is None
    assert ranks_even_text(even).startswith("ranks even: the rank that waited least in collectives waited")
    one_off = [ranks_window(r3={"comm_s": 0.0, "compute_s": 0.1})] + even
    assert straggler_verdict(one_off) is None


def test_without_the_time_in_collectives_only_a_slow_input_is_named():
    def ddp(**changes) -> list[dict]:
        window = ranks_window(**changes)
        for entry in window:
            entry.pop("comm_s"), entry.pop("compute_s")
            entry["comm"] = "ddp"
        return window
    slow = straggler_verdict([ddp(r0={"data_s": 0.05})] * 4)
    assert slow["rank"] == 0 and slow["slow_in"] == "input"
    assert straggler_verdict([ddp()] * 4) is None
    assert "DDP's gradient all-reduce runs in C++" in ranks_even_text([ddp()] * 4)


def test_windows_of_the_bundled_workload_keep_the_compute_rule():
    windows = [[{"rank": 0, "compute_s": 0.1}, {"rank": 1, "compute_s": 0.2}, {"rank": 2, "compute_s": 0.1}]] * 4
    assert straggler_verdict(windows)["rank"] == 1 and "slow_in" not in straggler_verdict(windows)


def test_the_live_feed_merges_hook_rows_as_they_come_and_begins_again_with_an_attempt():
    from fsdpctl.live.metrics_feed import MetricsFeed

    feed = MetricsFeed(world_size=2)
    node0 = [json_line(hook_row(0, s, 1, data_s=0.05, comm_s=0.0, compute_s=0.05)) for s in range(1, 6)]
    node1 = [json_line(hook_row(1, s, 1)) for s in range(1, 6)]
    feed.add_lines(node0)
    assert feed.step is None  # rank 1's rows are not in yet
    feed.add_lines(node1[:3])
    assert feed.step == 3 and feed.world == 2
    feed.add_lines(node1[3:])
    assert feed.step == 5
    straggler = feed.straggler()
    assert straggler["rank"] == 0 and straggler["slow_in"] == "input"
    feed.add_lines([json_line(hook_row(r, 1, 1, attempt=2)) for r in (0, 1)])
    assert feed.step == 1 and feed.series("loss") == [(1, 2.0)]  # attempt 2 counts from its start
