"""A run's exports as its collector writes them (``LiveExports`` on a run directory written as a collector
would), read back by TensorBoard's own reader and prometheus_client's parser; the writers' libraries
imported only for the export a run asks for (never torch, never by ``fsdpctl --help``), and a missing one
said in one line naming the extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fsdpctl.errors import UsageError
from fsdpctl.live import layout
from fsdpctl.live.exports import INSTALL, LiveExports
from tests.conftest import REPO
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

    exports.writer.flush()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/train")][:2] == [(1, pytest.approx(7.99)),
                                                                             (2, pytest.approx(7.98))]
    assert len(events.Scalars("rank1/compute_s")) == 20
    assert {e.value for e in events.Scalars("gpu/node1/gpu0/sm_clock_mhz")} == {1095}

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
