"""One line for what several ranks say: the folder's groups, their labels, their order and their windows,
and the CLI's printer showing them."""

from __future__ import annotations

from fsdpctl.cli.events import EventPrinter, folder_if
from fsdpctl.rundir.folding import LineFolder, label, rank_ranges
from fsdpctl.rundir.lines import LogLine


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def said(rank: int, text: str, ranks_per_node: int = 4) -> LogLine:
    node = rank // ranks_per_node
    return LogLine(node, f"n{node}", text, rank)


def shown(folder: LineFolder, lines: list[LogLine]) -> list[str]:
    out = []
    for line in lines:
        out += [f"[{label(f, folder.world) if len(f.ranks) > 1 else f.line.host}] {f.line.text}"
                for f in folder.add(line)]
    return out + [f"[{label(f, folder.world)}] {f.line.text}" for f in folder.drain()]


def test_ranks_read_as_ranges_and_a_label_says_who_said_it():
    assert rank_ranges([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    folder = LineFolder(world=16, clock=Clock())
    for rank in (0, 1, 2, 3):
        folder.add(said(rank, "loading"))
    assert label(folder.drain()[0], 16) == "n0 r0-3"  # several ranks of one host
    for rank in (0, 1, 4, 5):
        folder.add(said(rank, "loading"))
    assert label(folder.drain()[0], 16) == "r0-1,4-5"  # of several hosts
    assert shown(LineFolder(world=8, clock=Clock()), [said(r, "ready") for r in range(8)]) == ["[all 8 ranks] ready"]


def test_a_line_every_rank_said_is_shown_at_once_and_one_rank_saying_otherwise_stands_out():
    clock = Clock()
    folder = LineFolder(world=4, clock=clock)
    assert folder.add(said(0, "epoch 1")) == [] and folder.add(said(1, "epoch 1")) == []
    assert folder.add(said(2, "nan loss!")) == []  # behind the group opened before it: order kept
    assert folder.add(said(3, "epoch 1")) == []
    ready = folder.add(said(2, "epoch 1"))  # the fourth rank: complete and at the front, shown at once
    assert [(f.line.text, sorted(f.ranks)) for f in ready] == [("epoch 1", [0, 1, 2, 3])]
    clock.now = 0.6  # the odd line's window passed: shown alone, as it was
    assert [(f.line.text, sorted(f.ranks)) for f in folder.ready()] == [("nan loss!", [2])]
    assert not folder.waiting()


def test_a_rank_saying_the_same_again_opens_a_new_group_and_a_window_closes_a_group():
    clock = Clock()
    folder = LineFolder(world=2, clock=clock)
    folder.add(said(0, "tick"))
    folder.add(said(0, "tick"))  # rank 0 again: its second tick is a line of its own
    clock.now = 0.3
    assert [sorted(f.ranks) for f in folder.add(said(1, "tick"))] == []  # joins the newest open group
    clock.now = 0.7
    assert [(f.line.text, sorted(f.ranks)) for f in folder.ready()] == [("tick", [0]), ("tick", [0, 1])]
    clock.now = 1.0
    folder.add(said(0, "late"))
    clock.now = 1.6
    assert folder.add(said(1, "late")) != [] and folder.drain()[0].ranks == {1}  # past the window: apart


def test_lines_read_back_fold_across_one_ranks_burst_of_a_thousand():
    folder = LineFolder.by_lines(world=2)
    lines = [said(1, f"same {i}") for i in range(1000)] + [said(0, f"same {i}") for i in range(1000)]
    out = shown(folder, lines)
    assert out == [f"[all 2 ranks] same {i}" for i in range(1000)]


def test_the_printer_shows_a_folded_line_once_and_every_line_with_no_dedup(capsys):
    batch = [said(r, f"step {i} done", ranks_per_node=1) for i in range(3) for r in (0, 1)]
    batch.append(LogLine(0, "n0", "fsdpctl: node 0 of 2", None))
    printer = EventPrinter(quiet_progress=True, folder=folder_if(True, 2))
    printer.lines(batch)
    printer.finish()
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[all 2 ranks] step {i} done" for i in range(3)] + ["[n0] fsdpctl: node 0 of 2"]
    printer = EventPrinter(quiet_progress=True, folder=folder_if(False, 2))
    printer.lines(batch)
    printer.finish()
    assert len(capsys.readouterr().out.splitlines()) == 7


def test_the_lines_of_a_rank_that_keeps_saying_lines_alone_are_shown_as_they_come_until_others_join():
    clock = Clock()
    folder = LineFolder(world=4, clock=clock, at_once=True)
    for step in range(1, 4):  # rank 0's step lines, each alone: they wait out the window
        assert folder.add(said(0, f"step={step} loss=7.{step}")) == []
        clock.now += 0.6
        assert [f.line.text for f in folder.ready()] == [f"step={step} loss=7.{step}"]
    assert [f.line.text for f in folder.add(said(0, "checkpoint saved"))] == ["checkpoint saved"]  # at once
    assert folder.add(said(1, "a warning")) == []  # rank 1 has said nothing alone yet: it waits
    # ranks 1 and 5 say what rank 0's line said: they come on a line of their own once the window is over
    clock.now += 0.1
    assert folder.add(said(1, "checkpoint saved")) == [] and folder.add(said(5, "checkpoint saved")) == []
    clock.now += 0.6
    ready = folder.ready()
    assert [(f.line.text, sorted(f.ranks), label(f, 4)) for f in ready] == [
        ("a warning", [1], "n0 r1"), ("checkpoint saved", [1, 5], "r1,5")]
    assert not folder.waiting()
    assert folder.add(said(0, "step=4 loss=7.4")) == []  # rank 0 said a line with others: it waits again


def test_a_line_shown_at_once_never_overtakes_a_line_of_its_rank_still_waiting():
    clock = Clock()
    folder = LineFolder(world=4, clock=clock, at_once=True)
    for step in range(3):
        folder.add(said(0, f"step={step}"))
        clock.now += 0.6
        folder.ready()
    assert folder.add(said(1, "saving a checkpoint")) == []
    assert folder.add(said(0, "saving a checkpoint")) == []  # joins rank 1's line, still waiting
    assert folder.add(said(0, "step=3")) == []  # behind rank 0's own line that waits
    clock.now += 0.6
    assert [(f.line.text, sorted(f.ranks)) for f in folder.ready()] == [("saving a checkpoint", [0, 1]),
                                                                        ("step=3", [0])]


def test_a_rank_saying_lines_more_often_than_the_window_gets_them_shown_as_they_come_in_order():
    clock = Clock()
    folder = LineFolder(world=2, clock=clock, at_once=True)
    shown_when: dict[str, float] = {}
    for step in range(8):  # a line every 0.45 s: each came while the one before still waited
        clock.now = step * 0.45
        for group in folder.add(said(0, f"tick {step}")):
            shown_when[group.line.text] = clock.now
    assert list(shown_when) == [f"tick {step}" for step in range(8)]  # rank 0's order, whatever waited
    late = {text: round(at - int(text.split()[1]) * 0.45, 2) for text, at in shown_when.items()}
    assert late["tick 6"] == late["tick 7"] == 0.0, late  # past the start, at once
