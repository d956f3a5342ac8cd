"""`fsdpctl report`'s table of every rank: each rank's compute, collective wait, data wait (step-weighted
means over the windows) and peak memory with the straggler marked; folded above 8 ranks to the slowest,
median and fastest rank and the straggler (``--ranks``: all of them); every rank in ``--json``; an
escaped table in ``--html``; the collectives the hook could not time said; the same figures from the
run's chart index (one written before they were kept: none, and the report still made) as from its
files."""

from __future__ import annotations

import json
from array import array
from html.parser import HTMLParser

import pytest

from fsdpctl.live import layout
from fsdpctl.live.charts import ChartStore
from fsdpctl.live.collector import attempt_line
from fsdpctl.metrics.fold import Fold
from fsdpctl.metrics.rank_table import NOT_KEPT_NOTE, UNTIMED_NOTE
from fsdpctl.metrics.rank_windows import rank_entry
from fsdpctl.metrics.rows import read_rows
from fsdpctl.metrics.summary import render, summarize
from tests.conftest import run_cli
from tests.unit.test_live_model import RUN_ID, new_run, write

HOSTILE = "<img src=x onerror=alert(1)>"


def window(step: int, steps: int, figures: list[dict], **extra) -> dict:
    """A merged row of fsdpctl's rank telemetry: an entry per rank (``figures``: what differs)."""
    ranks = [{"rank": r, "node": r // 8, "host": f"n{r // 8}", "local_rank": r % 8, "timing": "hook",
              "wall_s": 0.2, "data_s": 0.001, "comm_s": 0.05, "compute_s": 0.149, "mem_mb": 325.0, **mine}
             for r, mine in enumerate(figures)]
    return {"kind": "train", "step": step, "steps": steps, "source": "hook", "loss": 2.0, "ranks": ranks, **extra}


def two_ranks_rows() -> list[dict]:
    """Step 1 alone (start-up: slow for both), then windows of 8 steps; rank 1 computes longer and
    waits less in collectives (the straggler); rank 0's memory peaks in one window."""
    rows = [window(1, 1, [{"compute_s": 1.0, "comm_s": 0.0}, {"compute_s": 1.0, "comm_s": 0.0}])]
    for end in range(9, 42, 8):
        rows.append(window(end, 8, [{"compute_s": 0.1, "comm_s": 0.099, "mem_mb": 326.0 if end == 17 else 325.0},
                                    {"compute_s": 0.19, "comm_s": 0.009, "data_s": 0.002}]))
    return rows


def lines_of(rows: list[dict]) -> list[str]:
    return [json.dumps(r) for r in rows]


def test_the_table_gives_each_of_two_ranks_figures_weighted_by_steps_and_marks_the_straggler():
    summary = summarize(read_rows(lines_of(two_ranks_rows()), "fsdp2"))
    assert summary.straggler["rank"] == 1
    first, second = summary.ranks
    # step 1 weighs 1 step, each later window 8: (1.0 + 0.1 * 40) / 41
    assert first["compute_s"] == pytest.approx(5.0 / 41, abs=1e-6)  # (kept to a microsecond)
    assert second["compute_s"] == pytest.approx(8.6 / 41, abs=1e-6)
    assert first["comm_s"] == pytest.approx(3.96 / 41, abs=1e-6)
    assert second["data_s"] == pytest.approx(0.081 / 41, abs=1e-6)
    assert (first["mem_mb"], second["mem_mb"]) == (326.0, 325.0)  # the peak, not the newest window's
    assert (first["host"], first["node"], first["local_rank"]) == ("n0", 0, 0)
    assert [r["straggler"] for r in summary.ranks] == [False, True]
    assert first["untimed_ops"] is None
    text = render([summary]).splitlines()
    at = text.index("each rank, seconds per step (step-weighted means over the run's windows):")
    assert text[at + 1:at + 4] == [
        "  rank  node  host  compute  collective wait  data wait  peak memory",
        "     0     0  n0      0.122            0.097      0.001       326 MB",
        "     1     0  n0      0.210            0.009      0.002       325 MB  straggler"]
    assert UNTIMED_NOTE not in text and "more ranks not shown" not in "\n".join(text)


def sixteen_ranks_rows() -> list[dict]:
    """16 ranks on 2 nodes, computing 0.100 + r ms a step; rank 11 computes 1.5x (the straggler);
    rank 3's batches take 0.3 s (the most time of its own, but under the compute rule no straggler)."""
    rows = []
    for step in range(1, 31):
        figures = [{"compute_s": 0.15 if r == 11 else 0.1 + r / 1000, "data_s": 0.3 if r == 3 else 0.001,
                    "timing": "workload"} for r in range(16)]
        rows.append(window(step, 1, figures))
    return rows


def test_above_eight_ranks_the_table_shows_the_slowest_median_fastest_and_the_straggler():
    summary = summarize(read_rows(lines_of(sixteen_ranks_rows()), "wide"))
    assert summary.straggler["rank"] == 11 and len(summary.ranks) == 16
    text = render([summary]).splitlines()
    at = text.index("each rank, seconds per step (step-weighted means over the run's windows):")
    shown = text[at + 2:at + 6]
    assert [line.split()[0] for line in shown] == ["3", "11", "8", "0"]  # by compute + data wait, slowest first
    assert [line.split("MB")[1].strip() for line in shown] == ["slowest", "straggler", "median", "fastest"]
    assert text[at + 6] == "  ... 12 more ranks not shown (fsdpctl report --ranks shows every rank)"
    every = render([summary], every_rank=True).splitlines()
    table = every[at + 2:at + 18]
    assert [int(line.split()[0]) for line in table] == list(range(16))
    assert [line.endswith("straggler") for line in table] == [r == 11 for r in range(16)]
    assert "more ranks not shown" not in "\n".join(every)


def test_collectives_the_hook_could_not_time_are_said_in_the_table_and_the_ranks_line():
    # two windows of a rank's rows merged: 8 steps with 12 untimed collectives each, 8 with none written
    merged = rank_entry([{"rank": 0, "step": 8, "steps": 8, "wall_s": 0.2, "untimed_ops": 12.0},
                         {"rank": 0, "step": 16, "steps": 8, "wall_s": 0.2}])
    assert merged["untimed_ops"] == 6.0
    rows = [window(step, 1, [{"untimed_ops": 12.0}, {"untimed_ops": 12.0}]) for step in range(1, 11)]
    summary = summarize(read_rows(lines_of(rows), "compiled"))
    assert summary.straggler is None and [r["untimed_ops"] for r in summary.ranks] == [12.0, 12.0]
    assert summary.ranks_text.startswith("ranks even: ")
    assert summary.ranks_text.endswith("; up to 12 collectives a step ran inside compiled code and are not timed: "
                                       "their time counts as compute")
    text = render([summary])
    assert "peak memory  untimed collectives" in text and "325 MB                   12" in text
    assert UNTIMED_NOTE in text


def test_a_resumed_runs_ranks_are_those_of_the_steps_kept_and_survive_the_chart_index():
    """Attempt 1 ran to step 60 with rank 1 slow, attempt 2 resumed from 40 with the ranks even: the
    fold that saw both says what the rows kept say (41-60 of attempt 1 gone, cutting into a chunk of
    windows 33-48); its state, restored, goes on the same."""
    first = [window(s, 1, [{"compute_s": 0.1}, {"compute_s": 0.2}]) for s in range(1, 61)]
    second = [window(s, 1, [{"compute_s": 0.1}, {"compute_s": 0.1}]) for s in range(41, 61)]
    live = Fold()
    for row in first:
        live.add("train", row)
    live.truncate(40)
    kept: list[array] = []
    restored = Fold()
    restored.restore(json.loads(json.dumps(live.state(lambda a: kept.append(a) or len(kept) - 1))), kept)
    for fold in (live, restored):
        for row in second:
            fold.add("train", row)
    whole = Fold.of_rows(first[:40] + second, [])
    assert whole.figures()["ranks"][1]["compute_s"] == pytest.approx((40 * 0.2 + 20 * 0.1) / 60, abs=1e-6)
    assert live.figures()["ranks"] == whole.figures()["ranks"] == restored.figures()["ranks"]


def test_each_ranks_figures_take_a_few_chunks_however_long_the_run():
    fold = Fold()
    for step in range(1, 10_001):
        fold.add("train", window(step, 1, [{"compute_s": 0.1 + step % 7 / 100}, {}]))
    assert len(fold.rank_figures.chunks[2]) <= 16 + 10
    assert fold.figures()["ranks"][0]["compute_s"] == pytest.approx(0.1 + sum(s % 7 for s in range(1, 10_001)) / 1e6)


def finished_run(tmp_path, rows: list[dict]):
    """A run that ended, its collector's copy of the metrics whole here."""
    from fsdpctl.rundir.state import RunState

    run = new_run(tmp_path)
    write(layout.collected(run.root, 0, "metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    write(layout.live_dir(run.root) / "collect.json", "{}")
    run.change(state=RunState.SUCCEEDED, finished_at="2026-11-26T13:00:00+00:00", exit_code=0, logs_complete=True)
    return run


def test_report_ranks_json_and_html_show_every_rank_the_html_escaped(tmp_path):
    rows = sixteen_ranks_rows()
    for row in rows:
        row["ranks"][5]["host"] = HOSTILE
    finished_run(tmp_path, rows)
    env = {"FSDPCTL_RUNS_DIR": str(tmp_path)}
    folded = run_cli("report", RUN_ID, "--no-fetch", env=env)
    assert folded.returncode == 0, folded.stderr
    assert "12 more ranks not shown" in folded.stdout and HOSTILE not in folded.stdout  # rank 5: not shown
    every = run_cli("report", RUN_ID, "--no-fetch", "--ranks", env=env)
    assert every.returncode == 0, every.stderr
    assert "more ranks not shown" not in every.stdout and f"     5     0  {HOSTILE}" in every.stdout
    assert sum(line.startswith(f"  {r:>4}  ") for line in every.stdout.splitlines() for r in range(16)) == 16

    data = json.loads(run_cli("report", RUN_ID, "--no-fetch", "--json", env=env).stdout)
    ranks = data["runs"][0]["ranks"]
    assert [r["rank"] for r in ranks] == list(range(16)) and ranks[5]["host"] == HOSTILE
    assert [r["rank"] for r in ranks if r["straggler"]] == [11]
    assert set(ranks[0]) == {"rank", "node", "host", "local_rank", "compute_s", "comm_s", "data_s", "mem_mb",
                             "untimed_ops", "straggler"}

    page = tmp_path / "report.html"
    made = run_cli("report", RUN_ID, "--no-fetch", "--html", str(page), env=env)
    assert made.returncode == 0, made.stderr
    written = page.read_text()
    assert HOSTILE not in written and "&lt;img src=x onerror=alert(1)&gt;" in written
    table = RanksTable()
    table.feed(written)
    assert "img" not in table.tags  # nothing in the page became an image
    assert len(table.rows) == 17 and table.rows[0][:4] == ["rank", "node", "host", "compute"]
    assert [row[2] for row in table.rows[1:]][5] == HOSTILE  # shown as the text it is
    assert [row[-1] for row in table.rows[1:]] == ["straggler" if r == 11 else "" for r in range(16)]


class RanksTable(HTMLParser):
    """The cells of the page's table of ranks (as a browser reads them: text unescaped), and every tag."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: set[str] = set()
        self.inside = False

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "table" and dict(attrs).get("id") == "ranks-table":
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.rows[-1].append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def test_a_chart_index_written_before_the_ranks_were_kept_still_reports(tmp_path):
    """The index's fold without the per-rank keys: the report says the rest as from the files, and
    that it has no table of ranks (rather than one of the rows read since)."""
    from fsdpctl.api.run import Run
    from fsdpctl.api.summaries import _indexed, report_of, run_series
    from fsdpctl.rundir.rundir import load_run

    run = finished_run(tmp_path, two_ranks_rows())
    store = ChartStore(run.root, run.plan, 2)
    store.update()
    assert store.save_index()
    magic, header, arrays = store.index_path.read_bytes().split(b"\n", 2)
    old = json.loads(header)
    del old["fold"]["rank_figures"]
    store.index_path.write_bytes(magic + b"\n" + json.dumps(old).encode() + b"\n" + arrays)
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    slow = [{"compute_s": 0.1, "comm_s": 0.099}, {"compute_s": 0.19, "comm_s": 0.009}]
    write(metrics, attempt_line(2, 33) + "".join(json.dumps(window(s, 8, slow)) + "\n" for s in (41, 49)))
    handle = Run(load_run(run.root))

    assert _indexed(handle) is not None and _indexed(handle).index_loaded
    report = report_of([handle], fetch=False)
    summary = report.summaries[0]
    _, from_files = run_series(handle, fetch=False, rows=True)
    assert summary.ranks == [] and len(from_files.ranks) == 2
    assert {**summary.to_json(), "ranks": None} == {**from_files.to_json(), "ranks": None}
    assert NOT_KEPT_NOTE in report.text and summary.straggler["rank"] == 1
    assert "each rank, seconds per step" in render([from_files])


def test_ranks_whose_steps_the_hook_could_not_see_are_said_from_the_files_and_from_the_index(tmp_path):
    from fsdpctl.node.events import STEPS_UNSEEN, event_row

    run = finished_run(tmp_path, [])
    for rank in (0, 1):  # a compiled training step, optimizer inside: each rank said so in its node's rows
        write(layout.collected(run.root, rank, f"telemetry/node{rank}.jsonl"), json.dumps(
            event_row(STEPS_UNSEEN, backward=16, rank=rank, node=rank, host=f"n{rank + 1}")) + "\n")
    env = {"FSDPCTL_RUNS_DIR": str(tmp_path)}
    said = ("steps not seen on ranks 0 on n1, 1 on n2: backward ran, but no optimizer step of torch's ended where "
            "fsdpctl can see it (the step runs inside torch.compile, or its optimizer is no torch.optim.Optimizer); "
            "its steps are not timed")
    from_files = run_cli("report", RUN_ID, "--no-fetch", env=env)
    assert from_files.returncode == 0, from_files.stderr
    assert said in from_files.stdout and "no per-rank timings" not in from_files.stdout
    store = ChartStore(run.root, run.plan)
    store.update()
    assert store.save_index()
    from fsdpctl.metrics.summary import summary_of

    reloaded = ChartStore(run.root, run.plan)
    reloaded.update()
    assert reloaded.index_loaded and summary_of(reloaded.fold, RUN_ID).unseen_text == said
