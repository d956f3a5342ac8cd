"""A hang read once for every follower of the run: the detached run's follower and each `logs -f` on it
fire on the same silence; the first reads the nodes, the others take its report."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from fsdpctl.diagnose.hang import REPORT, gather_hang


class CountingBackend:
    """Stacks that take a moment to read, as py-spy over SSH does; counts how often the nodes are read."""

    def __init__(self):
        self.reads = 0

    def stacks(self, run, **_):
        self.reads += 1
        time.sleep(0.3)
        return {}

    def fetch(self, run, path):
        return {}


def a_run(tmp_path, hang_timeout=10):
    return SimpleNamespace(root=tmp_path, plan=SimpleNamespace(hang_timeout=hang_timeout, run_id="r1"))


def test_followers_firing_together_read_the_nodes_once_and_show_the_same_report(tmp_path):
    backend, run = CountingBackend(), a_run(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(gather_hang(backend, run, 10.0))) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert backend.reads == 1
    assert [p.name for p in tmp_path.glob("hang*")] == ["hang"]
    assert (tmp_path / "hang" / REPORT).is_file()
    failures = {failure for failure, _ in results}
    assert len(failures) == 1 and next(iter(failures)).kind == "hang"
    assert len({tuple(lines) for _, lines in results}) == 1


def test_a_later_silence_is_read_again_into_a_folder_of_its_own(tmp_path):
    backend, run = CountingBackend(), a_run(tmp_path, hang_timeout=1)
    first, _ = gather_hang(backend, run, 1.0)
    time.sleep(0.6)  # past half the hang timeout: on_hang keep's next report, not the same silence
    second, _ = gather_hang(backend, run, 1.0)
    assert backend.reads == 2
    assert (first.hang_dir, second.hang_dir) == (str(tmp_path / "hang"), str(tmp_path / "hang-2"))
