"""A run's exports as its collector writes them (``LiveExports`` on a run directory written as a collector
would), read back by TensorBoard's own reader and prometheus_client's parser; the writers' libraries
imported only for the export a run asks for (never torch, never by ``fsdpctl --help``), and a missing one
said in one line naming the extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fsdpctl.errors import UsageError
from fsdpctl.live import layout
from fsdpctl.live.exports import INSTALL, LiveExports, missing_writers
from tests.conftest import REPO, run_cli
from tests.unit.test_layout import MODULES, third_party
from tests.unit.test_live_model import HOSTS, RUN_ID, gpu_sample, new_run, row, write

LIBRARIES = {"tensorboardX": "fsdpctl.export.tensorboard", "google_crc32c": "fsdpctl.export.tensorboard",
             "prometheus_client": "fsdpctl.export.prometheus"}


def a_run_going(tmp_path):
    """A run whose copies hold 20 steps of both ranks and both nodes' GPU samples (node 1's GPU slowed)."""
    run, now = new_run(tmp_path), time.time()
    write(layout.collected(run.root, 0, "metrics.jsonl"), "".join(row(s, now - 30 + s) for s in range(1, 21)))
    for node in (0, 1):
        write(layout.collected(run.root, node, f"gpu/node{node}.jsonl"),
              "".join(gpu_sample(node, now - 5 + i, slowed=node == 1) for i in range(5)))
    return run


def test_the_exports_read_back_with_tensorboards_reader_and_prometheus_clients_parser(tmp_path):
    run = a_run_going(tmp_path)
    began = time.time() - 40  # the launch, 40 s ago: the first step ends 10 s later, one a second to now
    run.change(timeline={"origin": began, "phases": {"startup": {"launcher": [0.0, 0.5]}}})
    textfile = tmp_path / "textfile" / f"fsdpctl_{RUN_ID}.prom"
    textfile.parent.mkdir()
    exports = LiveExports(run, tensorboard=str(tmp_path / "tb"), prometheus=str(textfile))
    exports.update(force=True)
    assert exports.problems == []

    families = {f.name: f for f in text_string_to_metric_families(textfile.read_text())}
    (clock,) = [s for s in families["DCGM_FI_DEV_SM_CLOCK"].samples if s.labels["host"] == HOSTS[1]]
    assert clock.value == 1095 and clock.labels == {"run": RUN_ID, "gpu": "0", "node": "1", "host": HOSTS[1],
                                                    "Hostname": HOSTS[1], "pci_bus_id": "00000000:18:00.0"}
    assert {s.labels["host"]: s.value for s in families["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"].samples} == {
        HOSTS[0]: 0, HOSTS[1]: 8}
    assert families["fsdpctl_step"].samples[0].value == 20
    assert families["fsdpctl_total_steps"].samples[0].value == 100
    assert {s.labels["rank"]: s.value for s in families["fsdpctl_rank_compute_seconds"].samples} == {"0": 0.1,
                                                                                                    "1": 0.1}
    info = families["fsdpctl_run_info"].samples[0].labels
    assert info["state"] == "running" and info["backend"] == "ssh"
    # where the run's time went so far: start-up to its first step (10.8 s), 20 steps, then to now
    badput = {s.labels["category"]: s.value for s in families["fsdpctl_badput_seconds"].samples}
    assert badput["startup"] == pytest.approx(10.8, abs=0.05) and badput["unattributed"] == 0.0
    ettr = families["fsdpctl_goodput_ettr"].samples[0].value
    assert 0.4 < ettr < 0.55 and families["fsdpctl_goodput_ratio"].samples[0].value <= ettr

    exports.writer.flush()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/train")][:2] == [(1, pytest.approx(7.99)),
                                                                             (2, pytest.approx(7.98))]
    assert len(events.Scalars("rank1/compute_s")) == 20
    assert {e.value for e in events.Scalars("gpu/node1/gpu0/sm_clock_mhz")} == {1095}
    assert [(e.step, e.value) for e in events.Scalars("goodput/ettr")] == [(20, pytest.approx(ettr, rel=1e-3))]
    assert events.Scalars("badput/startup_s")[0].value == pytest.approx(badput["startup"], rel=1e-3)

    exports.close()
    assert not textfile.exists()  # a run that ended is no longer current


def test_a_missing_library_is_one_line_naming_the_extra_and_the_run_goes_on(tmp_path, monkeypatch):
    for library, module in LIBRARIES.items():
        monkeypatch.setitem(sys.modules, library, None)  # ``import library`` now fails, as where it is missing
        monkeypatch.delitem(sys.modules, module, raising=False)
    run = a_run_going(tmp_path)
    exports = LiveExports(run, tensorboard=str(tmp_path / "tb"), prometheus=str(tmp_path / "x.prom"))
    assert exports.problems == [
        f"TensorBoard export to {tmp_path / 'tb'}: google_crc32c is not installed here ({INSTALL})",
        f"Prometheus export to {tmp_path / 'x.prom'}: prometheus_client is not installed here ({INSTALL})"]
    assert not exports.active
    exports.update(force=True)
    exports.close()
    assert not (tmp_path / "tb").exists() and not (tmp_path / "x.prom").exists()
    assert missing_writers({"tensorboard": str(tmp_path / "tb"), "prometheus": str(tmp_path / "x.prom")}) == \
        exports.problems  # what the launch says before the run starts
    # report --tensorboard asks for that export alone: an error, with the extra as its fix
    with pytest.raises(UsageError, match="is not installed here") as caught:
        LiveExports(run, tensorboard=str(tmp_path / "tb"), sources=([], []))
    assert INSTALL in caught.value.hint


def test_the_writers_libraries_are_imported_only_for_the_export_a_run_asks_for(tmp_path):
    code = textwrap.dedent(f"""\
        import sys
        from pathlib import Path
        from fsdpctl.cli.app import main
        WRITERS = {sorted(LIBRARIES)!r} + ["fsdpctl.export.prometheus", "fsdpctl.export.tensorboard"]
        def loaded():
            return sorted(m for m in WRITERS + ["torch"] if m in sys.modules)
        try:
            main(["--help"])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        print("help", loaded())
        from fsdpctl.live.exports import LiveExports
        from tests.unit.test_live_model import new_run
        tmp = Path(sys.argv[1])
        run = new_run(tmp)
        LiveExports(run)  # the plan asks for no export
        print("none", loaded())
        LiveExports(run, prometheus=str(tmp / "x.prom"))
        print("prometheus", loaded())
        LiveExports(run, tensorboard=str(tmp / "tb")).writer.close()
        print("tensorboard", loaded())
        """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.split(" ", 1)[0] in (
        "help", "none", "prometheus", "tensorboard"))
    assert said["help"] == said["none"] == "[]"
    assert said["prometheus"] == "['fsdpctl.export.prometheus', 'prometheus_client']"
    # torch is installed here, and tensorboardX would import it: the launcher never loads it
    assert said["tensorboard"] == ("['fsdpctl.export.prometheus', 'fsdpctl.export.tensorboard', 'google_crc32c', "
                                   "'prometheus_client', 'tensorboardX']")


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_each_writers_library_has_one_home(library):
    users = {m for m in MODULES if library in third_party(m)}
    assert users == {LIBRARIES[library]}, f"{library} imported by {sorted(users)}"


# ---- the exports and readers never stop a run or cut a number ------------------------------------------

def collecting(run, **exports):
    """The run's collector as its follower holds it, its copies read and its exports written at every beat."""
    from fsdpctl.live import collector as collector_module

    col = collector_module.Collector(run.root, run.plan, exports=LiveExports(run, **exports))
    col.read_at = col.index_at = float("-inf")
    return col


def beat(col) -> None:
    col.read_at = col.index_at = float("-inf")
    col.exports.updated_at = col.exports.textfile_at = float("-inf")
    col.beat(lambda: [], force=True)


def tensorboard_steps(folder, tag: str = "loss/train") -> list[int]:
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return [e.step for e in events.Scalars(tag)]


def test_a_full_disk_under_the_exporter_is_said_once_and_the_follow_the_charts_and_prometheus_go_on(
        tmp_path, monkeypatch):
    from fsdpctl.export.tensorboard import EventWriter
    from fsdpctl.live.charts import ChartStore
    from fsdpctl.live.collector import with_export_notes
    from fsdpctl.rundir.state import Outcome, RunState

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EventWriter, "scalars_at", full)
    run, now = new_run(tmp_path), time.time()
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    write(metrics, "".join(row(s, now - 30 + s) for s in range(1, 11)))
    textfile = tmp_path / "x.prom"
    col = collecting(run, tensorboard=str(tmp_path / "tb"), prometheus=str(textfile))
    beat(col)  # the event writer fails on the first scalar: the follower's beat goes on
    write(metrics, "".join(row(s, now - 30 + s) for s in range(11, 21)))
    beat(col)
    families = {f.name: f for f in text_string_to_metric_families(textfile.read_text())}
    assert families["fsdpctl_step"].samples[0].value == 20  # Prometheus has every step
    col.beat(lambda: [], ended=True)
    store = ChartStore(run.root, run.plan)
    store.update()
    assert store.index_loaded and store.to_json()["train"]["loss"]["x"] == list(range(1, 21))  # so has the index
    notes = with_export_notes(Outcome(exit_code=0, state=RunState.SUCCEEDED), col).notes
    assert notes == ("TensorBoard export: [Errno 28] No space left on device",), notes  # said once


@pytest.mark.parametrize("where", ["a consumer of the rows", "the exports", "the chart index"])
def test_a_stop_signal_that_lands_in_the_collectors_work_stops_the_launcher(tmp_path, where, monkeypatch):
    """The launcher's handler raises Interrupted wherever the main thread is. The collector's work runs on that
    thread behind guards that say a failure once and go on: a SIGTERM or Ctrl-C landing there was taken for
    a failed view and dropped, and the run went on (a 64-node launch ignored SIGTERM for 300 s)."""
    import signal

    from fsdpctl.backends.signals import Interrupted, raise_interrupted
    from fsdpctl.live.charts import ChartStore

    def stop(*args, **kwargs):
        raise_interrupted(signal.SIGTERM, None)

    if where == "a consumer of the rows":
        monkeypatch.setattr(ChartStore, "row", stop)
    elif where == "the exports":
        monkeypatch.setattr(LiveExports, "families", stop)
    else:
        monkeypatch.setattr(ChartStore, "save_index", stop)
    run, now = new_run(tmp_path), time.time()
    write(layout.collected(run.root, 0, "metrics.jsonl"), "".join(row(s, now - 30 + s) for s in range(1, 11)))
    col = collecting(run, tensorboard=str(tmp_path / "tb"), prometheus=str(tmp_path / "x.prom"))
    with pytest.raises(Interrupted):
        beat(col)
    assert not col.problems and not col.exports.problems and not col.reader.problems


def test_a_programs_odd_row_is_skipped_by_whom_it_cannot_take_and_every_other_row_goes_through(tmp_path):
    from fsdpctl.live.collector import with_export_notes
    from fsdpctl.rundir.state import Outcome, RunState

    run, now = new_run(tmp_path), time.time()
    odd = json.dumps({"step": 6, "loss": 1.0, "time": now, "ranks": [{"rank": [1], "compute_s": 0.1}]}) + "\n"
    rows = [row(s, now - 30 + s) for s in range(1, 11)]
    write(layout.collected(run.root, 0, "metrics.jsonl"), "".join(rows[:5]) + odd + "".join(rows[6:]))
    col = collecting(run, tensorboard=str(tmp_path / "tb"))
    beat(col)
    col.beat(lambda: [], ended=True)
    assert col.charts.to_json()["train"]["loss"]["x"] == list(range(1, 11))  # its loss, before its ranks failed
    assert [r["rank"] for r in col.charts.to_json()["heat"]["ranks"]] == [0, 1]
    assert tensorboard_steps(tmp_path / "tb") == list(range(1, 11))  # the exports took it whole
    notes = with_export_notes(Outcome(exit_code=0, state=RunState.SUCCEEDED), col).notes
    assert len(notes) == 1 and notes[0].startswith("ChartStore skipped a row it could not take: TypeError"), notes


def test_an_exporter_after_another_writes_each_step_once(tmp_path):
    run, now = new_run(tmp_path), time.time()
    metrics = layout.collected(run.root, 0, "metrics.jsonl")
    write(metrics, "".join(row(s, now - 30 + s) for s in range(1, 11)))
    first = collecting(run, tensorboard=str(tmp_path / "tb"))
    beat(first)
    first.close()  # its follower is gone (a restarted follower, the attempt after)
    write(metrics, "".join(row(s, now - 30 + s) for s in range(11, 16)))
    second = collecting(run, tensorboard=str(tmp_path / "tb"))
    beat(second)
    second.close()
    assert tensorboard_steps(tmp_path / "tb") == list(range(1, 16))


def test_report_tensorboard_exports_a_40_mib_copy_whole(tmp_path):
    run = new_run(tmp_path)
    copy = tmp_path / "metrics.jsonl"
    pad = "x" * 2100
    copy.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s, "time": 1000.0 + s, "note": pad}) + "\n"
                            for s in range(1, 20_001)))
    assert copy.stat().st_size > 40 << 20
    exports = LiveExports(run, tensorboard=str(tmp_path / "tb"), sources=([copy], []))
    exports.update(force=True)
    exports.close()
    assert tensorboard_steps(tmp_path / "tb") == list(range(1, 20_001))


def test_a_launch_says_a_missing_export_library_before_the_run_starts(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "google_crc32c.py").write_text(
        "raise ImportError('No module named google_crc32c', name='google_crc32c')\n")
    done = run_cli("launch", "-p", "local", "--dry-run", "--tensorboard", str(tmp_path / "tb"),
                   env={"PYTHONPATH": os.pathsep.join([str(blocked), str(REPO)])})
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "TensorBoard export" in line]
    assert len(said) == 1 and said[0].startswith(f"fsdpctl: warning: TensorBoard export to {tmp_path / 'tb'}/local-")
    assert said[0].endswith(f": google_crc32c is not installed here ({INSTALL}); the run goes on without it")


def test_a_programs_own_rows_from_every_nodes_copy_are_exported_once_per_step(tmp_path):
    """Each node's copy holds its rank's rows of 1,500 steps: read in turn with the charts' reader, every
    step goes to TensorBoard once, with both ranks' loss (read one copy whole after the other, more
    than 1,024 steps waited for the second rank and went out partial, then again)."""
    run = new_run(tmp_path)
    for rank in (0, 1):
        write(layout.collected(run.root, rank, "metrics.jsonl"), "".join(
            json.dumps({"step": s, "rank": rank, "loss": 2.0 + rank, "step_time_s": 0.2}) + "\n"
            for s in range(1, 1501)))
    col = collecting(run, tensorboard=str(tmp_path / "tb"))
    beat(col)
    col.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    losses = events.Scalars("loss/train")
    assert [e.step for e in losses] == list(range(1, 1501)) and {e.value for e in losses} == {2.5}
