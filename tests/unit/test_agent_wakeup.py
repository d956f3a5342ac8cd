"""The node agent's watch wakes when the run directory is written to (inotify), not at its next poll:
a line logged after a quiet spell, and the node's exit file, go out at once."""

from __future__ import annotations

import os
import select
import sys
import threading
import time

import pytest

from fsdpctl.backends.nodes import agent_watch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


class Quiet:
    """The launcher's side of the agent's input: a pipe nobody writes to."""

    def __init__(self):
        self.fd, self.writer = os.pipe()

    def read(self, n):
        return os.read(self.fd, n)


def drain(fd: int) -> None:
    while True:
        try:
            os.read(fd, 65536)
        except BlockingIOError:
            return


def test_the_log_written_or_the_exit_moved_in_wakes_it_and_the_other_files_writes_do_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node1.log").write_bytes(b"")  # another node's log, in a run directory they share
    (tmp_path / "metrics.jsonl").write_bytes(b"")
    wakeup = agent_watch.run_dir_wakeup()
    assert wakeup is not None
    try:
        assert not wakeup.follow("node0.log")  # not there yet
        (tmp_path / "node0.log").write_bytes(b"")  # created: a wake
        assert select.select([wakeup.fd], [], [], 5)[0] == [wakeup.fd]
        drain(wakeup.fd)
        assert wakeup.follow("node0.log")
        for other in ("node1.log", "metrics.jsonl"):
            with open(other, "ab") as handle:
                handle.write(b"a line\n")
        assert select.select([wakeup.fd], [], [], 0.2)[0] == []
        with open("node0.log", "ab") as log:
            log.write(b"step=1\n")
        assert select.select([wakeup.fd], [], [], 5)[0] == [wakeup.fd]
        drain(wakeup.fd)
        (tmp_path / "node0.exit.123").write_text("0\n")
        drain(wakeup.fd)
        os.rename("node0.exit.123", "node0.exit")  # as the node script's wrapper leaves its exit
        assert select.select([wakeup.fd], [], [], 5)[0] == [wakeup.fd]
    finally:
        wakeup.close()


def test_the_watch_wakes_for_a_line_logged_after_a_quiet_spell_and_drains_what_woke_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node0.log").write_bytes(b"")
    watch = agent_watch.Watch("run", 0, 30.0, inp=Quiet())
    watch.wakeup = agent_watch.run_dir_wakeup()
    assert watch.wakeup is not None and watch.wakeup.follow("node0.log")
    try:
        assert watch.pump_log() is False and not watch.log_came

        def logs_later():
            time.sleep(0.3)
            with open("node0.log", "ab") as log:
                log.write(b"step=2\n")
        writer = threading.Thread(target=logs_later)
        writer.start()
        began = time.monotonic()
        watch.listen(60.0)  # nothing from the launcher: only the write can end the wait before a minute
        writer.join()
        assert time.monotonic() - began < 30, "the watch slept through the write"
        assert select.select([watch.wakeup.fd], [], [], 0)[0] == []  # the events were read
        watch.pump_log()
        assert watch.log_came and b"step=2" in b"".join(frame for frame, _ in watch.data)
    finally:
        watch.wakeup.close()
