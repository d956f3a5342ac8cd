"""The side files' way from a node to the launching machine: the node's reader (new bytes only, a
bounded amount per poll, a replaced file read again from its start), the frames, and the collector's
copies (JSON lines appended across attempts and hosts, ``summary.json`` whole, how far each goes)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpctl.live import layout
from fsdpctl.live.collector import ATTEMPT_MARK, Collector, side_specs
from fsdpctl.node import side_files
from fsdpctl.node.side_files import CHUNK, FrameReader, SideFiles, parse_header


def frames_of(blobs: list[bytes]) -> list[tuple[int, int, int, bytes]]:
    return FrameReader().feed(b"".join(blobs))


def test_new_bytes_only_and_a_replaced_file_is_read_again_from_its_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    files = SideFiles([{"path": "metrics.jsonl"}, {"path": "gpu/node0.jsonl"}])
    first = frames_of(files.poll())
    inode = os.stat("metrics.jsonl").st_ino
    assert first == [(0, inode, 0, b'{"step": 1}\n')]  # the GPU file is not there yet: nothing, no error
    assert files.poll() == []
    with open("metrics.jsonl", "a") as handle:
        handle.write('{"step": 2}\n')
    assert frames_of(files.poll()) == [(0, inode, 12, b'{"step": 2}\n')]
    # the next attempt rewrites the file (rename into place): its start again, under its new inode
    (tmp_path / "new.jsonl").write_text('{"step": 1}\n')
    os.replace("new.jsonl", "metrics.jsonl")
    again = frames_of(files.poll())
    assert again == [(0, os.stat("metrics.jsonl").st_ino, 0, b'{"step": 1}\n')] and again[0][1] != inode
    # cut shorter in place (a fresh run truncates it): from its start
    Path("metrics.jsonl").write_text("x\n")
    assert frames_of(files.poll())[0][2:] == (0, b"x\n")
    files.close()


def test_a_flooding_file_is_sent_a_bounded_amount_per_poll_and_the_budget_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("big.jsonl").write_bytes(b"y" * (3 * CHUNK + 5))
    Path("small.jsonl").write_bytes(b"s\n")
    files = SideFiles([{"path": "big.jsonl"}, {"path": "small.jsonl"}])
    polls = [frames_of(files.poll()) for _ in range(4)]
    assert [len(f[0][3]) for f in polls] == [CHUNK, CHUNK, CHUNK, 5]
    assert polls[0][1][3] == b"s\n"  # the other file is not held back by the big one
    files.close()
    budgeted = SideFiles([{"path": "big.jsonl"}, {"path": "small.jsonl"}])
    assert sum(len(f[3]) for f in frames_of(budgeted.poll(budget=1000))) == 1000
    budgeted.close()


def test_a_later_reader_goes_on_from_the_offset_it_is_given_on_the_same_file_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("m.jsonl").write_bytes(b"0123456789")
    inode = os.stat("m.jsonl").st_ino
    assert frames_of(SideFiles([{"path": "m.jsonl", "ino": inode, "offset": 6}]).poll()) == [(0, inode, 6, b"6789")]
    # another file under the name, or an offset past its end: from the start
    assert frames_of(SideFiles([{"path": "m.jsonl", "ino": inode + 1, "offset": 6}]).poll())[0][2] == 0
    assert frames_of(SideFiles([{"path": "m.jsonl", "ino": inode, "offset": 60}]).poll())[0][2] == 0


def test_frames_cut_anywhere_come_out_whole_and_keepalives_are_skipped():
    data = [b"\x00\xff" * 100, b"line\n", b""]
    wire = side_files.KEEPALIVE + b"".join(side_files.header(i, 7, 3, len(d)) + d for i, d in enumerate(data))
    for cut in range(1, 12):
        reader, out = FrameReader(), []
        for at in range(0, len(wire), cut):
            out += reader.feed(wire[at:at + cut])
        assert out == [(i, 7, 3, d) for i, d in enumerate(data)]
    assert parse_header(b"+1 2 3 4\n") == (1, 2, 3, 4) and parse_header("|12") is None
    assert parse_header(b"+1 2 3") is None and parse_header(b"+a b c d") is None


def test_the_standalone_reader_sends_until_the_node_has_ended_and_everything_is_out(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    package_root = str(Path(side_files.__file__).parents[2])
    script = (f"import json, sys; sys.path.insert(0, {package_root!r}); from fsdpctl.node import side_files; "
              "sys.exit(side_files.main([json.dumps({'files': [{'path': 'metrics.jsonl'}], 'rank': 0})]))")
    reader = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE)
    time.sleep(0.6)
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 2}\n')
    (tmp_path / "node0.exit").write_text("0\n")  # the node ends: the reader leaves once all is out
    out, _ = reader.communicate(timeout=10)
    assert reader.returncode == 0
    assert b"".join(f[3] for f in FrameReader().feed(out)) == b'{"step": 1}\n{"step": 2}\n'


def test_the_reader_leaves_when_its_follower_is_gone(tmp_path):
    class Gone(io.RawIOBase):
        def write(self, data):
            raise BrokenPipeError

    (tmp_path / "m.jsonl").write_text("x\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert side_files.follow([{"path": "m.jsonl"}], 0, 0, out=Gone()) == 0
    finally:
        os.chdir(cwd)


@dataclass
class Plan:
    """What the collector reads of a plan."""

    run_dir: str
    shared_run_dir: bool = False
    nodes: tuple = ()
    num_nodes: int = 2


def collector(tmp_path: Path, attempt: int = 1, from_step=None) -> Collector:
    root = tmp_path / "run"
    root.mkdir(exist_ok=True)
    return Collector(root, Plan("~/fsdpctl-runs/run"), attempt, from_step)


def test_copies_grow_and_a_file_that_begins_again_is_appended_on_a_line_of_its_own(tmp_path):
    col = collector(tmp_path)
    col.take(0, "n1", 0, 11, 0, b'{"step": 1}\n{"step": 2, "lo')  # cut mid-line: the rest comes next
    col.take(0, "n1", 0, 11, 27, b'ss": 1}\n')
    copy = layout.collected(col.root, 0, "metrics.jsonl")
    assert copy.read_bytes() == b'{"step": 1}\n{"step": 2, "loss": 1}\n'
    col.take(0, "n1", 0, 12, 0, b'{"step": 1}\n{"st')  # the node's file was replaced
    col.take(0, "n1", 0, 13, 0, b'{"step": 9}\n')  # and again, its copy cut mid-line
    assert copy.read_bytes().splitlines()[-3:] == [b'{"step": 1}', b'{"st', b'{"step": 9}']
    col.take(0, "n1", 1, 20, 0, b'{"a": 1}')  # summary.json: written whole, each time
    col.take(0, "n1", 1, 21, 0, b'{"b": 2}')
    assert layout.collected(col.root, 0, "summary.json").read_bytes() == b'{"b": 2}'
    col.take(3, "n4", 2, 30, 0, b'{"t": 1}\n')
    assert layout.collected(col.root, 3, "gpu/node3.jsonl").read_bytes() == b'{"t": 1}\n'
    col.take(0, "n1", 7, 1, 0, b"index out of the list")  # a frame that names no file: dropped
    col.save()
    assert side_specs(col.root, Plan("~/fsdpctl-runs/run"), 0, "n1") == [
        {"path": "metrics.jsonl", "ino": 13, "offset": 12}, {"path": "summary.json", "ino": 21, "offset": 8},
        {"path": "gpu/node0.jsonl", "ino": 0, "offset": 0}, {"path": "telemetry/node0.jsonl", "ino": 0, "offset": 0}]
    # another host in node 0's place (a spare): its files are others, sent whole
    assert all(s["offset"] == 0 for s in side_specs(col.root, Plan("~/fsdpctl-runs/run"), 0, "n9"))


def test_a_run_written_here_is_not_collected(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    col = Collector(root, Plan(str(root)))
    assert not col.collecting and col.specs(0, "localhost") is None
    assert side_specs(root, Plan(str(root)), 0, "localhost") is None
    assert Collector(root, Plan("/shared/runs/x", shared_run_dir=True)).collecting is False
    col.take(0, "localhost", 0, 1, 0, b"x\n")
    assert not layout.collected(root, 0, "metrics.jsonl").exists()


def test_a_later_attempt_marks_each_metrics_copy_with_the_step_it_resumes_from(tmp_path):
    col = collector(tmp_path)
    col.take(0, "n1", 0, 11, 0, b'{"step": 1}\n{"step": 2')
    col.save()
    Collector(col.root, Plan("~/fsdpctl-runs/run"), attempt=2, from_step=1).save()
    lines = layout.collected(col.root, 0, "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1]) == {ATTEMPT_MARK: 2, "from_step": 1}
    Collector(col.root, Plan("~/fsdpctl-runs/run"), attempt=2, from_step=1)  # the same attempt again: no second mark
    assert len(layout.collected(col.root, 0, "metrics.jsonl").read_text().splitlines()) == len(lines)


def test_the_follower_says_how_the_nodes_stand_at_most_every_second(tmp_path):
    col = collector(tmp_path)
    col.beat(lambda: [{"node_rank": 0, "state": "running"}])
    said = json.loads((layout.live_dir(col.root) / layout.FOLLOWER).read_text())
    assert said["pid"] == os.getpid() and said["nodes"][0]["state"] == "running" and not said["ended"]
    col.beat(lambda: [{"node_rank": 0, "state": "failed"}])  # within the second: not written again
    assert json.loads((layout.live_dir(col.root) / layout.FOLLOWER).read_text())["nodes"][0]["state"] == "running"
    col.beat(lambda: [{"node_rank": 0, "state": "failed"}], ended=True, extra={"slurm_state": "COMPLETED"})
    said = json.loads((layout.live_dir(col.root) / layout.FOLLOWER).read_text())
    assert said["ended"] and said["nodes"][0]["state"] == "failed" and said["slurm_state"] == "COMPLETED"


def test_one_collector_at_a_time_and_a_viewer_knows_whether_one_lives(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    assert layout.collector_alive(root) is None  # never collected
    with layout.collector_lock(root) as got:
        assert got and layout.collector_alive(root) is True
        with layout.collector_lock(root) as again:  # the same process, nested (a launcher's attempts)
            assert again
        assert layout.collector_alive(root) is True
        probe = subprocess.run([sys.executable, "-c",
                                "import sys; from pathlib import Path; from fsdpctl.live import layout\n"
                                "with layout.collector_lock(Path(sys.argv[1]), wait=0.2) as got: print(got)",
                                str(root)], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        assert probe.stdout.strip() == "False"  # another process does not get it
    assert layout.collector_alive(root) is False


def test_the_collector_keeps_the_runs_chart_index_as_the_copies_grow(tmp_path, monkeypatch):
    from fsdpctl.live import collector as collector_module
    from fsdpctl.live.charts import ChartStore

    col = collector(tmp_path)
    rows = "".join(json.dumps({"step": s, "loss": 1.0 / s, "time": 1000.0 + s}) + "\n" for s in range(1, 6))
    col.take(0, "n1", 0, 11, 0, rows.encode())
    col.beat(lambda: [])  # the index is kept every INDEX_SECONDS, not at every beat
    index = layout.live_dir(col.root) / "charts.idx"
    assert not index.exists()
    monkeypatch.setattr(collector_module, "INDEX_SECONDS", 0.0)
    col.beat(lambda: [])
    assert index.is_file()
    col.take(0, "n1", 0, 11, len(rows), b'{"step": 6, "loss": 0.1, "time": 1006.0}\n')
    col.beat(lambda: [], ended=True)  # and at the end, whatever the time
    store = ChartStore(col.root, col.plan)
    store.update()
    assert store.index_loaded and store.to_json()["train"]["loss"]["x"] == [1, 2, 3, 4, 5, 6]


def test_the_agent_reads_the_side_files_with_the_logs_new_lines_so_both_leave_in_one_write(tmp_path, monkeypatch):
    from fsdpctl.backends.nodes import agent_watch

    monkeypatch.chdir(tmp_path)
    (tmp_path / "node0.log").write_bytes(b"")
    (tmp_path / "metrics.jsonl").write_bytes(b"")
    watch = agent_watch.Watch("run", 0, 30.0, inp=None, side=SideFiles([{"path": "metrics.jsonl"}]))
    now = time.time()
    watch.pump_log()
    watch.pump_side(now, ended=False)  # the first poll, with nothing yet
    # a step: its row, then its line (as a program writes them), a tenth of the poll interval later
    with open("metrics.jsonl", "ab") as rows, open("node0.log", "ab") as log:
        rows.write(b'{"step": 1}\n')
        log.write(b"step=1\n")
    assert watch.pump_log() is False and watch.log_came
    assert watch.pump_side(now + 0.15, ended=False)
    assert [side for _, side in watch.data] == [False, True]  # the line's frame, then the row's: one write takes both
    # without a new line, the side files wait for their own interval
    with open("metrics.jsonl", "ab") as rows:
        rows.write(b'{"step": 2}\n')
    watch.pump_log()
    assert not watch.pump_side(now + 0.3, ended=False)
    assert watch.pump_side(now + 0.15 + agent_watch.SIDE_POLL_SECONDS, ended=False)
