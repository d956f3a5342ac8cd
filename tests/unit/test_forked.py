"""A function over a list in forked processes: answers in order whatever the number of workers, and
an item whose process died gets the stand-in answer instead of hanging or vanishing."""

from __future__ import annotations

import os

from fsdpctl.workload.forked import side_by_side


def square_and_pid(n):
    return [n * n, os.getpid()]


def dies_on_three(n):
    if n == 3:
        os._exit(9)
    return n


def test_answers_come_back_in_order_from_forked_processes_or_from_this_one():
    items = list(range(7))
    for workers in (1, 2, 3, 10):
        answers = side_by_side(square_and_pid, items, workers)
        assert [a[0] for a in answers] == [n * n for n in items]
        pids = {a[1] for a in answers}
        assert pids == {os.getpid()} if workers == 1 else (os.getpid() not in pids and len(pids) == min(workers, 7))


def test_an_item_whose_process_died_gets_the_stand_in_and_the_others_their_answers():
    answers = side_by_side(dies_on_three, list(range(6)), 2, lost=lambda n: f"lost {n}")
    # worker 1 takes 1, 3, 5: it dies at 3, so 5 is lost with it
    assert answers == [0, 1, 2, "lost 3", 4, "lost 5"]
