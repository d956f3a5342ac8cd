"""What the launcher learns from the ranks' rows, never from their printed lines: what a restart cost
(from the bundled workload's training rows, read by each attempt's collector as the nodes send them),
and the start-up hook's rows after a program's DCP save, async save or Hugging Face Trainer call, which
never reach the program when they fail."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from fsdpctl.api.attempts import plan_next_attempt
from fsdpctl.api.events import Emitter
from fsdpctl.backends.ssh import SSHBackend
from fsdpctl.live.collector import Collector
from fsdpctl.node import checkpoint_calls
from fsdpctl.node.startup import sitecustomize as hook
from fsdpctl.rundir.attempts import begin_attempt
from fsdpctl.rundir.lines import LogLine
from fsdpctl.rundir.rundir import load_run
from fsdpctl.rundir.state import RunState
from tests.unit.test_attempts import new_run


class Node0:
    """Node 0 of an attempt: its rank 0 writes metrics.jsonl as the bundled workload does (its own
    clock stamped on each row), its agent sends what the file gained to the attempt's collector."""

    def __init__(self, run_dir: Path, collector: Collector, resumed_step=None):
        from fsdpctl.workload.metrics import RunLog

        self.collector, self.sent = collector, 0
        self.log = RunLog(run_dir, rank=0, resumed_step=resumed_step)

    def trains(self, monkeypatch, step: int, at: float, tok_s: float) -> None:
        monkeypatch.setattr(time, "time", lambda: at)
        self.log.train_line(1, step, 3.0, 1e-3, tok_s, None, 100.0, None)

    def sends(self) -> None:
        path = self.log.path
        data = path.read_bytes()[self.sent:]
        self.collector.take(0, "10.9.0.1", 0, os.stat(path).st_ino, self.sent, data)
        self.sent += len(data)


def test_what_a_restart_cost_comes_from_the_training_rows_on_the_nodes_clock(tmp_path, monkeypatch):
    from fsdpctl.api.recovery import RecoveryClock  # (here: the hook's tests below stand without it)
    from fsdpctl.live.collector import listen

    run = new_run(tmp_path)
    on_node = tmp_path / "node0"
    on_node.mkdir()
    clock = RecoveryClock(Emitter(None))
    first = Collector(run.root, run.plan, 1)
    listen(first, clock, None)
    node = Node0(on_node, first)
    for step in range(1, 13):  # logged every step, checkpoint at 10; the node fails after step 12
        node.trains(monkeypatch, step, 1000.0 + step, 500.0 + step)
    node.sends()
    # the program's own look-alike step line, printed after the failure: no row, no figure
    clock(LogLine(0, "10.9.0.1", "[rank0]: step=99 loss=1.0 tok/s=999999"))
    first.beat(list, ended=True)
    assert (clock.last_step, clock.tok_s) == (12, 512.0)

    run.change(state=RunState.FAILED, exit_code=1)
    plan, scripts = plan_next_attempt(SSHBackend(run.profile), run, train={})
    second_run = begin_attempt(run, plan, scripts, 10)
    clock.restarted(second_run, 10)
    second = Collector(second_run.root, second_run.plan, 2, 10)
    listen(second, clock, None)
    node = Node0(on_node, second, resumed_step=10)  # the file rewritten: its rows up to step 10 come again
    node.trains(monkeypatch, 11, 1030.5, 480.0)  # 30 s after the failed attempt's last row, on the node's clock
    node.trains(monkeypatch, 12, 1031.5, 490.0)
    node.sends()
    second.beat(list)  # the first read: the index is kept from the attempt before
    second.beat(list, ended=True)
    recovery = load_run(run.root).record.recovery
    assert (recovery.stood_still_s, recovery.steps_redone, recovery.tok_s_before) == (18.5, 2, 512.0)
    assert recovery.tok_s_after is None  # the first rows after a restart are warm-up
    for step in range(13, 16):
        node.trains(monkeypatch, step, 1019.0 + step, 500.0 + step)
    node.sends()
    second.beat(list, ended=True)
    assert load_run(run.root).record.recovery.tok_s_after == 514.0  # the third row after the first (step 14)


@pytest.fixture
def rank0(tmp_path, monkeypatch):
    """Rank 0 of a program of yours on node 2, its hook's saying of saves reset."""
    for name, value in {"FSDPCTL_RUN_DIR": str(tmp_path), "FSDPCTL_NODE_RANK": "2", "RANK": "0",
                        "FSDPCTL_ATTEMPT": "3"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(checkpoint_calls, "_SAVES_OFF", [])
    return tmp_path


def test_the_hook_writes_a_row_after_each_dcp_save_into_its_nodes_telemetry_and_nothing_else(rank0, capfd):
    failure = ValueError("disk full")

    def save(state, *, checkpoint_id):
        if checkpoint_id == "bad":
            raise failure
        return {"saved": checkpoint_id}

    dcp = SimpleNamespace(save=save)
    hook._time_checkpoints(dcp)
    hook._time_checkpoints(dcp)  # said once however often torch.distributed.checkpoint is imported
    assert dcp.save.__wrapped__ is save and dcp.save.__name__ == "save"
    assert dcp.save({}, checkpoint_id="ckpt/1") == {"saved": "ckpt/1"}
    with pytest.raises(ValueError) as raised:
        dcp.save({}, checkpoint_id="bad")
    assert raised.value is failure  # the program's own exception, and no row: nothing was saved
    rows = [json.loads(line) for line in (rank0 / "telemetry" / "node2.jsonl").read_text().splitlines()]
    assert [(r["fsdpctl_event"], r["by"], r["rank"], r["step"], r["attempt"]) for r in rows] == [
        ("checkpoint_saved", "dcp", 0, None, 3)]
    assert rows[0]["seconds"] >= 0 and rows[0]["began"] <= rows[0]["time"] and "async" not in rows[0]
    assert capfd.readouterr() == ("", "")  # invisible: the program's output is its own


def test_a_row_the_hook_cannot_write_is_one_line_on_stderr_and_the_save_stands(rank0, monkeypatch, capfd):
    blocked = rank0 / "telemetry"
    blocked.write_text("a file where the folder should be")
    dcp = SimpleNamespace(save=lambda state, checkpoint_id: "done")
    hook._time_checkpoints(dcp)
    assert [dcp.save({}, checkpoint_id=f"ckpt/{i}") for i in range(3)] == ["done"] * 3
    out, err = capfd.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "fsdpctl: the start-up hook is off for checkpoint saves" in err


def _events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "telemetry" / "node2.jsonl").read_text().splitlines()]


def test_an_async_save_says_its_call_the_programs_wait_and_its_write_once_it_ends(rank0):
    written = Future()
    dcp = SimpleNamespace(async_save=lambda state, checkpoint_id: written)
    hook._time_checkpoints(dcp)
    future = dcp.async_save({}, checkpoint_id="ckpt/4")
    assert future is written and type(future) is Future  # the program's own object
    assert [r["fsdpctl_event"] for r in _events(rank0)] == ["checkpoint_staged"]  # not saved yet: written behind
    threading.Timer(0.2, written.set_result, args=("metadata",)).start()
    assert future.result() == "metadata"  # the program waits on it
    deadline = time.monotonic() + 10  # the write's row comes from the thread that ended the future, after
    while len(_events(rank0)) < 3 and time.monotonic() < deadline:  # result() returned: in either order
        time.sleep(0.01)
    rows = {r["fsdpctl_event"]: r for r in _events(rank0)}
    assert sorted(rows) == ["checkpoint_saved", "checkpoint_staged", "checkpoint_wait"]
    staged, saved, wait = rows["checkpoint_staged"], rows["checkpoint_saved"], rows["checkpoint_wait"]
    assert saved["written"] is True and saved["async"] is True and saved["began"] == staged["began"]
    assert saved["seconds"] >= 0.19 and saved["call_s"] == staged["seconds"]
    assert 0.15 <= wait["seconds"] <= saved["seconds"] + 0.05
    assert future.result() == "metadata" and len(_events(rank0)) == 3  # a wait on a done future: nothing to say


def test_the_hf_trainers_saves_loads_and_evaluations_are_timed_with_its_own_step(rank0, tmp_path):
    class Trainer:
        def __init__(self):
            self.state = SimpleNamespace(global_step=12)

        def _save_checkpoint(self, model, trial):
            return None

        def _load_from_checkpoint(self, folder, model=None):
            raise FileNotFoundError(folder)

        def evaluate(self, eval_dataset=None):
            return {"eval_loss": 1.5}

    module = ModuleType("transformers.trainer")
    module.Trainer = Trainer
    save = Trainer._save_checkpoint
    hook._time_trainer(module)
    hook._time_trainer(module)  # once, however often it is imported
    assert Trainer._save_checkpoint.__wrapped__ is save
    trainer = Trainer()
    trainer._save_checkpoint(None, None)
    assert trainer.evaluate() == {"eval_loss": 1.5}
    with pytest.raises(FileNotFoundError):  # the Trainer's own error, and no row: nothing was loaded
        trainer._load_from_checkpoint(str(tmp_path / "none"))
    rows = _events(rank0)
    assert [(r["fsdpctl_event"], r["by"], r["global_step"]) for r in rows] == [
        ("checkpoint_saved", "hf", 12), ("evaluation", "hf", 12)]
