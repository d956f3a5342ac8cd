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


def test_a_write_or_a_file_moved_into_the_run_directory_makes_the_wakeup_readable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fd = agent_watch.run_dir_wakeup()
    assert fd is not None
    try:
        assert select.select([fd], [], [], 0)[0] == []
        with open("node0.log", "ab") as log:
            log.write(b"step=1\n")
        assert select.select([fd], [], [], 5)[0] == [fd]
        while True:
            try:
                os.read(fd, 65536)
            except BlockingIOError:
                break
        (tmp_path / "node0.exit.123").write_text("0\n")
        os.rename("node0.exit.123", "node0.exit")  # as the node script's wrapper leaves its exit
        assert select.select([fd], [], [], 5)[0] == [fd]
    finally:
        os.close(fd)


def test_the_watch_wakes_for_a_line_logged_after_a_quiet_spell_and_drains_what_woke_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "node0.log").write_bytes(b"")
    watch = agent_watch.Watch("run", 0, 30.0, inp=Quiet())
    watch.wakeup = agent_watch.run_dir_wakeup()
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
        assert select.select([watch.wakeup], [], [], 0)[0] == []  # the events were read
        watch.pump_log()
        assert watch.log_came and b"step=2" in b"".join(frame for frame, _ in watch.data)
    finally:
        os.close(watch.wakeup)
