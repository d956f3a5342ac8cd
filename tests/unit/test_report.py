"""`fsdpctl report`'s parts on metrics written as the workload and as a user's program write them:
the summary matches the rows, the figures are valid PNGs holding the series drawn (read back)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from fsdpctl.metrics.rows import read_rows
from fsdpctl.metrics.summary import render, summarize


def workload_rows(steps: int, ranks: int, slow_rank: int | None = None, val_every: int = 10) -> list[str]:
    rows = []
    for step in range(1, steps + 1):
        entry = [{"rank": r, "node": r, "host": f"10.0.0.{r + 1}", "compute_s": 0.05 * (1.5 if r == slow_rank else 1),
                  "comm_s": 0.01, "data_s": 0.001, "wall_s": 0.08, "mem_mb": 400.0 + r} for r in range(ranks)]
        rows.append(json.dumps({"kind": "train", "step": step, "loss": 8.0 - step * 0.05, "lr": 3e-4,
                                "tokens_per_s": 1000.0 + step, "mfu": None, "mem_mb": 400.0, "step_time_s": 0.08,
                                "ranks": entry}))
        if step % val_every == 0:
            rows.append(json.dumps({"kind": "val", "step": step, "val_loss": 8.1 - step * 0.05}))
    return rows


def png_chunks(path: Path) -> tuple[tuple[int, int], dict[str, str]]:
    """(width, height) and the text chunks of a PNG, checking every chunk's CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, size, texts = 8, None, {}
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            texts[key.decode()] = value.decode("latin-1")
        at += 12 + length
        if kind == b"IEND":
            break
    return size, texts


def test_the_summary_matches_the_rows():
    series = read_rows(workload_rows(30, 4, slow_rank=2) + ["{\"step\": 31, \"loss\""], "run-a")
    summary = summarize(series, attempts=2)
    assert summary.steps == 30 and summary.final_loss == pytest.approx(8.0 - 1.5)
    assert summary.best_loss == pytest.approx(6.5) and summary.best_loss_step == 30
    assert summary.final_val_loss == pytest.approx(8.1 - 1.5) and summary.best_val_loss == pytest.approx(6.6)
    assert summary.tokens_per_s == pytest.approx(1015.5) and summary.step_time_s == pytest.approx(0.08)
    assert summary.memory_mb_per_rank == [400.0, 401.0, 402.0, 403.0] and summary.world == 4
    assert summary.straggler["rank"] == 2 and summary.straggler["host"] == "10.0.0.3"
    assert series.skipped == 1  # the line cut short
    text = render([summary])
    assert "final loss" in text and "6.5000" in text and "straggler: rank 2 on 10.0.0.3 (node 2)" in text
    assert "1 line(s) of metrics.jsonl" in text and "attempts" in text


def test_a_users_program_rows_from_every_rank_are_merged():
    lines = []
    for step in range(1, 11):
        for rank in range(2):
            lines.append(json.dumps({"step": step, "rank": rank, "loss": 2.0 / step + rank * 0.1,
                                     "step_time_s": 0.02 * (1.6 if rank == 1 else 1.0), "tokens_per_s": 500}))
    series = read_rows(lines, "mine")
    assert len(series.train) == 10 and series.world == 2
    assert series.train[0]["loss"] == pytest.approx(2.05) and series.train[0]["tokens_per_s"] == 1000
    summary = summarize(series)
    assert summary.straggler is not None and summary.straggler["rank"] == 1
    assert summary.final_loss == pytest.approx(0.25)


def test_figures_are_valid_pngs_with_the_series_drawn(tmp_path):
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from fsdpctl.metrics.plots import draw

    one = read_rows(workload_rows(30, 4, slow_rank=2), "run-a")
    two = read_rows(workload_rows(20, 4), "run-b")
    written = draw([one], [summarize(one)], tmp_path / "one")
    names = sorted(p.name for p in written)
    assert names == ["loss.png", "memory.png", "step_time_ranks.png", "throughput.png"]
    series = {p.name: png_chunks(p)[1]["fsdpctl:series"] for p in written}
    assert series == {"loss.png": "2", "throughput.png": "1", "step_time_ranks.png": "4", "memory.png": "1"}
    both = draw([one, two], [summarize(one), summarize(two)], tmp_path / "two")
    series = {p.name: png_chunks(p)[1]["fsdpctl:series"] for p in both}
    assert series == {"loss.png": "4", "throughput.png": "2", "step_time_ranks_run-a.png": "4",
                      "step_time_ranks_run-b.png": "4", "memory.png": "2"}
    for path in both:
        (width, height), texts = png_chunks(path)
        assert width >= 600 and height >= 100 and texts["fsdpctl:figure"]


def test_a_one_rank_run_has_nothing_to_compare_its_timings_with():
    solo = summarize(read_rows(workload_rows(12, 1), "solo"))
    assert solo.straggler is None and solo.world == 1
    text = render([solo])
    assert "no straggler: a single rank, with no other rank to compare its timings with" in text
    assert "no per-rank timings" not in text
    untimed = summarize(read_rows([json.dumps({"kind": "train", "step": s, "loss": 2.0}) for s in range(1, 6)], "b"))
    assert "no per-rank timings in its metrics: no straggler verdict" in render([untimed])


@pytest.mark.parametrize("ranks", [1, 2, 4, 16])
def test_nothing_in_the_compute_heat_map_is_cut_off(tmp_path, monkeypatch, ranks):
    """The heat map's title and every label (its axes', its colour bar's) lie inside the image as it
    is written: a one-rank strip once cut its colour bar's label off at both ends."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from fsdpctl.metrics import plots

    cut: list[tuple[str, str]] = []
    save = plots._save

    def save_and_check(fig, path, figure, series):
        written = save(fig, path, figure, series)  # laid out as it is written
        renderer, frame = fig.canvas.get_renderer(), fig.bbox
        for text in (text for ax in fig.axes for text in (ax.title, ax.xaxis.label, ax.yaxis.label)):
            if text.get_text():
                box = text.get_window_extent(renderer)
                if box.x0 < frame.x0 - 1 or box.y0 < frame.y0 - 1 or box.x1 > frame.x1 + 1 or box.y1 > frame.y1 + 1:
                    cut.append((path.name, text.get_text()))
        return written

    monkeypatch.setattr(plots, "_save", save_and_check)
    series = read_rows(workload_rows(20, ranks), "run-a")
    written = plots.draw([series], [summarize(series)], tmp_path)
    assert "step_time_ranks.png" in [p.name for p in written]
    assert cut == []
