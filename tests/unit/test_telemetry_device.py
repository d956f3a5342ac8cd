"""The telemetry's GPU side on this CPU-only machine: what only a GPU can run is stood in for at the
narrowest seam (a CUDA event that says when the device has passed it; pinned memory as plain
memory), and the logic around it is the real one: no wait for the device on the training thread,
losses read once their copy has landed, NCCL's timed collectives given to their steps, and a
reporter that writes every rank's rows."""

from __future__ import annotations

import json
import pickle
import types

import pytest

from fsdpctl.node.telemetry import reporter as reporter_module
from fsdpctl.node.telemetry.device import SLOTS, GpuLosses, NcclTimes, nccl_entries, resolve
from fsdpctl.node.telemetry.patches import Patches
from fsdpctl.node.telemetry.reporter import Reporter
from fsdpctl.node.telemetry.steps import StepTracker

torch = pytest.importorskip("torch")


class Event:
    """A CUDA event as the telemetry uses it: recorded, then asked whether the device passed it."""

    made: list[Event] = []

    def __init__(self, enable_timing: bool = False):
        self.passed = False
        Event.made.append(self)

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return self.passed

    def synchronize(self) -> None:
        raise AssertionError("the telemetry never blocks on the device")


def gpu_torch() -> types.SimpleNamespace:
    """torch as the GPU code paths see it, the device's own calls stood in for."""
    cuda = types.SimpleNamespace(Event=Event, is_available=lambda: False, is_initialized=lambda: False,
                                 is_current_stream_capturing=lambda: False)
    return types.SimpleNamespace(zeros=lambda n, dtype, pin_memory: torch.zeros(n, dtype=dtype), stack=torch.stack,
                                 float32=torch.float32, cuda=cuda)


class CudaLike:
    """A loss tensor that says it is on the GPU."""

    def __init__(self, value: float):
        self.tensor = torch.tensor(value)
        self.is_cuda = True

    def float(self):
        return self.tensor.float()


def test_a_gpu_loss_is_read_once_its_copy_landed_never_waited_for():
    Event.made.clear()
    losses = GpuLosses(gpu_torch())
    pending = losses.reduce([CudaLike(0.5), CudaLike(0.25)])
    assert resolve(pending) == (False, None)  # the device has not got there: the training thread goes on
    Event.made[-1].passed = True
    assert resolve(pending) == (True, 0.75)
    assert len(losses.free) == 256  # the slot is free again
    assert resolve(None) == (True, None) and resolve(2.5) == (True, 2.5)


def test_nccls_timed_collectives_go_to_the_steps_they_were_created_in():
    dump = pickle.dumps({"version": "2.9", "entries": [
        {"pg_id": 0, "collective_seq_id": 1, "time_created_ns": 100, "duration_ms": 2.0, "state": "completed"},
        {"pg_id": 0, "collective_seq_id": 2, "time_created_ns": 150, "duration_ms": 3.0, "state": "completed"},
        {"pg_id": 0, "collective_seq_id": 3, "time_created_ns": 250, "duration_ms": 4.0, "state": "completed"},
        {"pg_id": 0, "collective_seq_id": 4, "time_created_ns": 260, "duration_ms": None, "state": "scheduled"},
        {"pg_id": 1, "collective_seq_id": 1, "time_created_ns": 260, "duration_ms": 1.0, "state": "completed"}]})
    times = NcclTimes()
    times.add(nccl_entries(dump))
    times.add(nccl_entries(dump))  # read again a second later: counted once
    assert times.for_step(200) == pytest.approx(0.005)
    assert times.for_step(300) == pytest.approx(0.005)
    assert times.for_step(400) == 0.0


def test_the_reporter_writes_each_window_once_its_losses_are_in(tmp_path, monkeypatch):
    Event.made.clear()
    fake = gpu_torch()
    gpu = GpuLosses(fake)
    tracker = StepTracker(gpu.reduce)
    patches = Patches(tracker, say=lambda text: None)
    path = tmp_path / "telemetry" / "node1.jsonl"
    reporter = Reporter(tracker, patches, str(path), {"rank": 3, "node": 1, "host": "n2", "local_rank": 1},
                        torch=types.SimpleNamespace(**vars(fake), distributed=types.SimpleNamespace(
                            is_available=lambda: True, is_initialized=lambda: True, get_backend=lambda: "gloo")),
                        tokens_per_step=4096, world=4)
    tracker.after_step = reporter.step_ended  # as install() hands it over
    opt = object()
    for _ in range(3):
        tracker.backward_called(CudaLike(1.5))
        tracker.optimizer_starts(opt)
        tracker.optimizer_ended(opt)
    reporter.flush()
    assert not path.exists()  # the first step's loss is still on its way
    for event in Event.made:
        event.passed = True
    reporter.flush()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["steps"]) for r in rows] == [(1, 1), (2, 1), (3, 1)]
    assert all(r["loss"] == 1.5 and r["rank"] == 3 and r["comm"] == "waited" and r["tokens"] == "declared"
               for r in rows)
    assert all(r["tokens_per_s"] > 0 for r in rows)  # 4096 tokens a step over 4 ranks: 1024 on this one
    tracker.backward_called(CudaLike(2.0))
    tracker.optimizer_starts(opt)
    tracker.optimizer_ended(opt)
    polls = []

    def device_gets_there(seconds: float) -> None:  # the device passes the marks while close polls
        polls.append(seconds)
        if len(polls) == 3:
            for event in Event.made:
                event.passed = True
    monkeypatch.setattr(reporter_module.time, "sleep", device_gets_there)
    reporter.close()  # the program's end: the device is polled for, the last window written
    last = json.loads(path.read_text().splitlines()[-1])
    assert (last["step"], last["loss"]) == (4, 2.0) and len(polls) == 3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def gpu_reporter(tmp_path, clock=None) -> tuple[StepTracker, Reporter, GpuLosses]:
    fake = gpu_torch()
    gpu = GpuLosses(fake)
    tracker = StepTracker(gpu.reduce)
    reporter = Reporter(tracker, Patches(tracker, say=lambda text: None), str(tmp_path / "node0.jsonl"),
                        {"rank": 0, "node": 0, "host": "n1", "local_rank": 0}, world=1,
                        torch=types.SimpleNamespace(**vars(fake), distributed=types.SimpleNamespace(
                            is_available=lambda: True, is_initialized=lambda: False)),
                        **({"clock": clock} if clock else {}))
    tracker.after_step = reporter.step_ended
    return tracker, reporter, gpu


def steps(tracker: StepTracker, count: int, loss: float = 1.0) -> None:
    opt = object()
    for _ in range(count):
        tracker.backward_called(CudaLike(loss))
        tracker.optimizer_starts(opt)
        tracker.optimizer_ended(opt)


def test_a_rank_whose_device_never_finishes_exits_after_the_deadline_not_at_torchruns_kill(tmp_path, monkeypatch):
    Event.made.clear()
    clock = Clock()
    monkeypatch.setattr(reporter_module.time, "monotonic", clock)
    monkeypatch.setattr(reporter_module.time, "sleep", clock.sleep)
    tracker, reporter, _ = gpu_reporter(tmp_path)
    steps(tracker, 2)
    began = clock.now
    reporter.close()  # a peer died: the last collective, and the loss copies behind it, never complete
    assert began + reporter_module.CLOSE_WAIT_S <= clock.now < began + reporter_module.CLOSE_WAIT_S + 0.1
    rows = [json.loads(line) for line in (tmp_path / "node0.jsonl").read_text().splitlines()]
    assert sum(r["steps"] for r in rows) == 2 and all("loss" not in r for r in rows)  # written without them


def test_losses_given_up_on_free_their_slots_once_the_device_is_past_them(tmp_path):
    Event.made.clear()
    clock = Clock()
    tracker, reporter, gpu = gpu_reporter(tmp_path, clock)
    steps(tracker, SLOTS + 20)  # a device stalled far behind: every slot taken, the last 20 steps get none
    assert not gpu.free
    reporter.flush()  # taken, waiting for their losses
    clock.now += reporter_module.LOSS_WAIT_S + 1
    reporter.flush()  # their steps go out without a loss
    for event in Event.made:
        event.passed = True  # the device caught up
    steps(tracker, 3, loss=2.5)
    for event in Event.made:
        event.passed = True
    reporter.close()
    rows = [json.loads(line) for line in (tmp_path / "node0.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == SLOTS + 23 and rows[-1]["loss"] == 2.5  # losses are recorded again
    assert len(gpu.free) + len(gpu.abandoned) == SLOTS


def test_nccl_entries_are_counted_once_however_long_the_run():
    """The flight recorder's ring (its newest entries) read every second for a long run: each
    completed collective counted once, whatever was read before."""
    times, ring, total = NcclTimes(), [], 0.0
    for seq in range(1, 150_001):
        ring.append({"pg_id": seq % 2, "collective_seq_id": seq // 2 + 1, "p2p_seq_id": 0,
                     "time_created_ns": seq, "duration_ms": 1.0, "state": "completed"})
        total += 0.001
        if seq % 1000 == 0:
            ring = ring[-3000:]
            times.add(ring)
    assert times.for_step(150_001) == pytest.approx(total)
    assert len(times.taken) == 2
