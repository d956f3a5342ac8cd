"""The goodput account's partition: every second once, in the category its facts give it."""

from __future__ import annotations

import json
import os
import stat
import time
from types import SimpleNamespace

import pytest

from fsdpctl.accounting.account import CATEGORIES, AttemptFacts, RunFacts, Timed, Window, account
from fsdpctl.accounting.facts import run_facts
from fsdpctl.accounting.render import bar, one_line, section
from fsdpctl.rundir.state import RunState


def tiled(begin: float, steps: int, step_s: float, first_s: float, *, data_s: float = 0.0, comm_s: float = 0.0,
          from_step: int = 0) -> list[Window]:
    """One step's window (the first, ``first_s`` long), then windows of one step each, tiling."""
    windows, at = [], begin
    for n in range(steps):
        length = first_s if n == 0 else step_s
        windows.append(Window(end=at + length, steps=1, last_step=from_step + n + 1, begin=at,
                              data_s=data_s, comm_s=comm_s))
        at += length
    return windows


def test_a_clean_attempt_is_start_up_warm_up_steps_a_save_and_its_tail_and_adds_up():
    windows = tiled(10.0, 20, 1.0, 4.0, data_s=0.1, comm_s=0.2)  # steps from 10 to 33
    save = Timed(began=20.0, seconds=2.0, kind="save", step=10, complete=True)  # inside steps 8-9
    attempt = AttemptFacts(1, begin=0.0, end=40.0, ranks=4, held=4, windows=windows, timed=[save])
    counted = account(RunFacts(begin=0.0, end=40.0, attempts=[attempt]))
    s = counted.seconds
    assert s["startup"] == pytest.approx(10.0)
    assert s["warmup"] == pytest.approx(3.0)  # the first step's 4 s against a median of 1 s
    assert s["checkpoint_save"] == pytest.approx(2.0)
    assert s["shutdown"] == pytest.approx(40.0 - 33.0)
    # 23 s of windows (4 + 19 x 1) less the save's 2 and the warm-up's 3: 18 s, 0.1 and 0.2 of each step waiting
    in_steps = s["productive"] + s["data_wait"] + s["collective_wait"]
    assert in_steps == pytest.approx(18.0)
    assert s["data_wait"] == pytest.approx(0.1 * 20, rel=0.1)
    assert s["collective_wait"] == pytest.approx(0.2 * 20, rel=0.1)
    assert s["unattributed"] == 0.0
    assert sum(s.values()) == pytest.approx(40.0)
    assert sum(counted.gpu_s.values()) == pytest.approx(counted.held_gpu_s) == pytest.approx(160.0)
    assert counted.ettr == pytest.approx((18.0 + 3.0) / 40.0)
    assert counted.goodput == pytest.approx(s["productive"] / 40.0)


def test_a_failed_attempt_books_its_work_after_the_last_checkpoint_once_and_the_restart_stands_still():
    first = AttemptFacts(1, begin=0.0, end=30.0, ranks=2, held=4, failed=True, failed_at=26.0,
                         windows=tiled(5.0, 20, 1.0, 1.0), durable_step=10, durable_at=16.0,
                         timed=[Timed(began=15.0, seconds=1.0, kind="save", step=10, complete=True)])
    second = AttemptFacts(2, begin=35.0, end=60.0, ranks=2, held=4, windows=tiled(40.0, 10, 1.0, 1.0, from_step=10),
                          timed=[Timed(began=37.0, seconds=2.0, kind="load")])
    counted = account(RunFacts(begin=0.0, end=60.0, attempts=[first, second]))
    s = counted.seconds
    # steps 11..20 ran from 16 to 25; the failure at 26: all of it thrown away, once
    assert s["redone"] == pytest.approx(26.0 - 16.0)
    assert counted.steps_redone == 10
    assert s["stood_still"] == pytest.approx((30.0 - 26.0) + (35.0 - 30.0))
    assert s["checkpoint_load"] == pytest.approx(2.0)
    assert s["startup"] == pytest.approx(5.0 + (40.0 - 35.0 - 2.0))
    assert sum(s.values()) == pytest.approx(60.0) and s["unattributed"] == 0.0
    # two ranks run, two more are held (a spare node): idle the whole time
    assert counted.gpu_s["idle"] == pytest.approx(2 * 60.0)
    assert sum(counted.gpu_s.values()) == pytest.approx(counted.held_gpu_s) == pytest.approx(4 * 60.0)


def test_a_hang_runs_from_the_last_progress_to_the_verdict_and_the_teardown_stands_still():
    hung = AttemptFacts(1, begin=0.0, end=50.0, ranks=2, held=2, failed=True, hang_at=45.0, failed_at=48.0,
                        windows=tiled(5.0, 10, 1.0, 1.0))  # last step at 15
    counted = account(RunFacts(begin=0.0, end=50.0, attempts=[hung]))
    s = counted.seconds
    assert s["hang"] == pytest.approx(30.0)
    assert s["stood_still"] == pytest.approx(5.0)
    assert s["redone"] == pytest.approx(10.0)  # no checkpoint: every step is lost
    assert counted.steps_redone == 10
    assert sum(s.values()) == pytest.approx(50.0)


def test_what_no_fact_covers_is_unattributed_and_an_attempt_without_steps_is_start_up():
    no_steps = AttemptFacts(1, begin=0.0, end=10.0, ranks=1, held=1, failed=True, failed_at=8.0)
    counted = account(RunFacts(begin=0.0, end=12.0, attempts=[no_steps]))
    assert counted.seconds["startup"] == pytest.approx(8.0)
    assert counted.seconds["stood_still"] == pytest.approx(2.0)
    assert counted.seconds["unattributed"] == pytest.approx(2.0)  # past the attempt's recorded end


def test_a_day_of_one_second_windows_is_divided_in_one_pass():
    windows = tiled(0.0, 86_400, 1.0, 1.0)
    attempt = AttemptFacts(1, begin=0.0, end=86_401.0, ranks=8, held=8, windows=windows)
    began = time.process_time()
    counted = account(RunFacts(begin=0.0, end=86_401.0, attempts=[attempt]))
    assert counted.seconds["productive"] == pytest.approx(86_400.0)
    assert time.process_time() - began < 30  # quadratic would be hours: this bounds the shape, not the speed


def test_the_text_has_one_line_a_bar_as_wide_as_asked_and_a_row_per_category_used():
    attempt = AttemptFacts(1, begin=0.0, end=20.0, ranks=2, held=2, windows=tiled(5.0, 10, 1.0, 1.0))
    counted = account(RunFacts(begin=0.0, end=20.0, attempts=[attempt]))
    assert one_line(counted).startswith("goodput: ETTR 50.0%, strict 50.0% of 20.0 s; most lost to")
    assert len(bar(counted, 40)) == 42
    text = "\n".join(section(counted))
    assert CATEGORIES["startup"] in text and CATEGORIES["hang"] not in text


def _record(**fields):
    base = {"attempt": 1, "attempts": (), "timeline": None, "started_at": None, "finished_at": None,
            "state": RunState.SUCCEEDED, "from_step": None, "replacements": ()}
    return SimpleNamespace(**{**base, **fields})


def test_the_bundled_workloads_rows_become_windows_with_its_evaluations_and_saves_carved_out(tmp_path):
    origin = 1000.0
    timeline = {"origin": origin, "phases": {"startup": {"launcher": [0.0, 0.5]}, "exit": {"0": [29.0, 29.0]},
                                             "logs": {"0": [30.0, 30.0]}}}
    rows = [{"fsdpctl_event": "steps_begin", "kind": "event", "time": origin + 10.0, "attempt": 1, "step": 0},
            {"kind": "train", "step": 5, "time": origin + 15.0, "ranks": [{"rank": 0, "data_s": 0.1, "comm_s": 0.2,
                                                                          "compute_s": 0.7}]},
            {"kind": "val", "step": 5, "time": origin + 17.0, "eval_s": 2.0},
            {"fsdpctl_event": "checkpoint_saved", "kind": "event", "time": origin + 18.0, "attempt": 1, "step": 5,
             "by": "workload", "began": origin + 17.0, "seconds": 1.0},
            {"kind": "train", "step": 10, "time": origin + 23.0, "ranks": [{"rank": 0, "data_s": 0.1, "comm_s": 0.2,
                                                                           "compute_s": 0.7}]}]
    plan = SimpleNamespace(nproc_per_node=2, num_nodes=1, full_nodes=None, command=None)
    facts = run_facts(_record(timeline=timeline), plan, tmp_path, rows)
    counted = account(facts)
    s = counted.seconds
    assert s["startup"] == pytest.approx(10.0)
    assert s["between_steps"] == pytest.approx(2.0) and counted.eval_s == pytest.approx(2.0)
    assert s["checkpoint_save"] == pytest.approx(1.0)
    assert sum(s[k] for k in ("productive", "data_wait", "collective_wait", "warmup")) == pytest.approx(10.0)
    assert s["shutdown"] == pytest.approx(7.0)
    assert sum(s.values()) == pytest.approx(30.0) and s["unattributed"] == 0.0


def test_a_programs_own_rows_of_every_rank_make_windows_and_the_first_starts_at_its_own_step_time(tmp_path):
    origin = 2000.0
    timeline = {"origin": origin, "phases": {"exit": {"0": [20.0, 20.0]}, "logs": {"0": [21.0, 21.0]}}}
    rows = [{"step": n, "rank": r, "loss": 1.0, "step_time_s": 0.5, "time": origin + 5.0 + n}
            for n in range(1, 11) for r in (0, 1)]
    plan = SimpleNamespace(nproc_per_node=2, num_nodes=1, full_nodes=None, command=("train.py",))
    counted = account(run_facts(_record(timeline=timeline), plan, tmp_path, rows))
    s = counted.seconds
    assert s["startup"] == pytest.approx(5.5)  # the first step's end (6.0) less its own 0.5 s
    # 0.5 s of step 1, then nine windows of 1 s each; warm-up: none (the first step was quicker than the rest)
    assert s["productive"] == pytest.approx(9.5) and s["unattributed"] == 0.0
    assert s["shutdown"] == pytest.approx(21.0 - 15.0)


def test_the_hooks_windows_stand_for_a_step_its_program_also_wrote_a_row_of(tmp_path):
    origin = 3000.0
    timeline = {"origin": origin, "phases": {"logs": {"0": [10.0, 10.0]}}}
    hook = [{"step": n, "steps": 1, "kind": "train", "source": "hook", "rank": 0, "node": 0, "attempt": 1,
             "time": origin + 4.0 + n, "wall_s": 1.0, "data_s": 0.25, "comm_s": 0.0, "compute_s": 0.75}
            for n in range(1, 5)]
    own = [{"step": n, "loss": 1.0, "time": origin + 4.0 + n} for n in range(1, 5)]
    plan = SimpleNamespace(nproc_per_node=1, num_nodes=1, full_nodes=None, command=("train.py",))
    counted = account(run_facts(_record(timeline=timeline), plan, tmp_path, hook + own))
    assert counted.seconds["data_wait"] == pytest.approx(1.0)  # 4 steps x 0.25, once
    assert counted.seconds["startup"] == pytest.approx(4.0) and counted.seconds["shutdown"] == pytest.approx(2.0)


def test_since_takes_an_age_or_a_date_and_refuses_anything_else_in_one_line():
    from datetime import datetime, timezone

    from fsdpctl.api.goodput import since_moment
    from fsdpctl.errors import UsageError

    now = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
    assert since_moment("7d", now) == datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)
    assert since_moment("90m", now) == datetime(2026, 11, 28, 10, 30, tzinfo=timezone.utc)
    assert since_moment("2026-11-21T08:00+00:00", now) == datetime(2026, 11, 21, 8, 0, tzinfo=timezone.utc)
    with pytest.raises(UsageError) as refused:
        since_moment("last week", now)
    assert "--since 'last week'" in str(refused.value) and "7d" in refused.value.hint


def test_many_runs_are_totalled_and_the_ones_that_lost_most_are_named_with_their_largest_loss():
    from fsdpctl.accounting.across import RunAccount, lines, to_json

    good = account(RunFacts(0.0, 100.0, [AttemptFacts(1, 0.0, 100.0, 2, 2, windows=tiled(2.0, 97, 1.0, 1.0))]))
    slow = account(RunFacts(0.0, 100.0, [AttemptFacts(1, 0.0, 100.0, 2, 2, windows=tiled(60.0, 30, 1.0, 1.0))]))
    runs = [RunAccount("good-1", "two-node", None, good), RunAccount("slow-1", "two-node", None, slow)]
    text = lines(runs, "on profile two-node", ["queued-1"])
    assert text[0].startswith("goodput of 2 run(s) on profile two-node: 0.111 GPU-h held")
    worst = [line for line in text if line.startswith("    ")]
    assert worst[0].startswith("    slow-1 (two-node)") and "largest: start-up to first step (60.0%)" in worst[0]
    assert "1 run(s) without an account (no timeline): queued-1" in text[-1]
    data = to_json(runs, "x", [])
    assert data["total"]["held_gpu_hours"] == pytest.approx(400 / 3600, abs=1e-6)
    assert [r["largest_loss"] for r in data["runs"]] == ["startup", "startup"]


def test_a_live_runs_account_is_counted_again_after_30_s_or_twenty_times_what_it_took():
    from fsdpctl.accounting.cache import due

    assert not due(100.0, 0.2, 129.0) and due(100.0, 0.2, 130.0)  # a short run: every 30 s
    assert not due(100.0, 27.0, 600.0) and due(100.0, 27.0, 640.0)  # a day's run of 8 ranks: every 9 minutes


def test_an_async_save_costs_its_call_and_the_wait_on_it_and_its_write_ends_the_work_thrown_away(tmp_path):
    origin = 4000.0
    timeline = {"origin": origin, "phases": {"exit": {"0": [30.0, 30.0]}, "logs": {"0": [31.0, 31.0]}}}
    hook = [{"step": n, "steps": 1, "kind": "train", "source": "hook", "rank": 0, "node": 0, "attempt": 1,
             "time": origin + 2.0 + n, "wall_s": 1.0, "compute_s": 1.0} for n in range(1, 25)]

    def event(name, began, seconds, **fields):
        return {"fsdpctl_event": name, "kind": "event", "attempt": 1, "time": origin + began + seconds,
                "began": origin + began, "seconds": seconds, "steps": 8, **fields}

    events = [event("checkpoint_staged", 10.0, 1.0, **{"async": True}),
              event("checkpoint_saved", 10.0, 4.0, **{"async": True, "written": True}),  # written by 14
              event("checkpoint_wait", 15.0, 0.5),
              event("evaluation", 18.0, 2.0, by="hf")]
    plan = SimpleNamespace(nproc_per_node=1, num_nodes=1, full_nodes=None, command=("train.py",))
    record = _record(timeline=timeline, state=RunState.FAILED)
    counted = account(run_facts(record, plan, tmp_path, hook + events))
    s = counted.seconds
    assert s["checkpoint_save"] == pytest.approx(1.5)  # the call and the wait; the write blocked nobody
    assert (counted.async_save_s, counted.async_wait_s, counted.async_written_s) == pytest.approx((1.0, 0.5, 3.0))
    # failed at 30: everything after the write's end (14) is thrown away, the evaluation with it, but the wait
    assert s["redone"] == pytest.approx(30.0 - 14.0 - 0.5)
    assert counted.eval_s == pytest.approx(2.0) and s["between_steps"] == 0.0
    assert counted.steps_redone == 24 - 8
    assert sum(s.values()) == pytest.approx(31.0) and s["unattributed"] == 0.0
    assert "0.5 s waiting on them" in "\n".join(section(counted))


def test_each_minute_of_the_run_adds_up_to_its_account_and_its_start_up_comes_first():
    windows = tiled(100.0, 300, 1.0, 4.0, data_s=0.1)  # steps from 100 s to 403 s
    saves = [Timed(began=200.0 + 60 * n, seconds=5.0, kind="save", step=100 + 60 * n, complete=True) for n in range(3)]
    attempt = AttemptFacts(1, begin=0.0, end=420.0, ranks=2, held=2, windows=windows, timed=saves)
    counted = account(RunFacts(begin=0.0, end=420.0, attempts=[attempt]))
    minutes = counted.to_json()["minutes"]
    assert minutes["bucket_s"] == 5.0 and len(minutes["buckets"]) == 84  # 420 s in at most 120 buckets
    for name, seconds in counted.seconds.items():
        assert sum(b.get(name, 0.0) for b in minutes["buckets"]) == pytest.approx(seconds, abs=0.05 * 84), name
    assert minutes["buckets"][0] == {"startup": 5.0} and minutes["buckets"][-1] == {"shutdown": 5.0}
    assert minutes["buckets"][40] == {"checkpoint_save": 5.0}  # the first save, 200-205 s


def test_an_ended_runs_account_is_kept_and_counted_again_only_when_its_files_change(tmp_path):
    from fsdpctl.accounting.cache import KEPT_NAME, account_of_dir
    from tests.unit.test_attempts import new_run

    run = new_run(tmp_path)
    origin = 5000.0
    run.change(state=RunState.SUCCEEDED, timeline={"origin": origin, "phases": {"logs": {"0": [20.0, 20.0]}}})
    rows = tmp_path / "metrics.jsonl"
    rows.write_text("".join(f'{{"kind": "train", "step": {n}, "time": {origin + 4 + n}, "step_time_s": 1.0}}\n'
                            for n in range(1, 11)))
    old_umask = os.umask(0o022)  # a notebook's usual umask: the run's files stay private all the same
    try:
        first = account_of_dir(run, [rows])
    finally:
        os.umask(old_umask)
    assert first.seconds["productive"] == pytest.approx(10.0)
    assert stat.S_IMODE((run.root / KEPT_NAME).stat().st_mode) == 0o600
    kept = json.loads((run.root / KEPT_NAME).read_text())
    kept["account"]["seconds"]["productive"] = 123.0  # what is kept is what is read back, rows unread
    (run.root / KEPT_NAME).write_text(json.dumps(kept))
    assert account_of_dir(run, [rows]).seconds["productive"] == 123.0
    with rows.open("a") as more:  # a file brought back later: counted again
        more.write(f'{{"kind": "train", "step": 11, "time": {origin + 15}, "step_time_s": 1.0}}\n')
    again = account_of_dir(run, [rows])
    assert again.seconds["productive"] == pytest.approx(11.0)
    assert again.to_json() == account_of_dir(run, [rows]).to_json()  # ... and kept again, whole
