"""The GPU watcher beside the ranks (against the fake nvidia-smi, as a real process), what it says at
once, and its samples read back: each node's GPUs now, over the run, and a straggler's cause."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from fsdpctl.hostpool.blame import nodes_to_blame
from fsdpctl.metrics.gpu_samples import (
    gpu_cause,
    latest_by_node,
    newest_samples,
    newest_text,
    now_text,
    read_samples,
    run_lines,
)
from fsdpctl.node.gpu_watch import CLOCKS, HARDWARE_FAULT, changes, fault_in_log, sample_gpu
from fsdpctl.rundir.state import NodeState
from fsdpctl.rundir.status import NodeStatus
from tests.conftest import REPO
from tests.testbed import fake_gpu


def gpu(index, **values):
    row = {"index": str(index), "pci.bus_id": f"00000000:{index + 0x18:02X}:00.0", "clocks.sm": "1980",
           "clocks.max.sm": "1980", "temperature.gpu": "60", "power.draw": "650", "utilization.gpu": "99",
           "memory.used": "70000", "ecc.errors.uncorrected.volatile.total": "0", "remapped_rows.pending": "No"}
    return sample_gpu({**row, **values})


def test_a_new_fault_and_a_slowdown_are_said_once_each():
    before = [gpu(0), gpu(1)]
    now = [gpu(0), gpu(1, **{"ecc.errors.uncorrected.volatile.total": "2", "clocks.sm": "1095",
                             "clocks_event_reasons.hw_slowdown": "Active"})]
    said = changes(before, now, "n2")
    assert said == [f"{HARDWARE_FAULT} GPU 1 (00000000:19:00.0) on n2: new uncorrectable ECC error(s), 2 since the "
                    "driver loaded", f"{CLOCKS} GPU 1 (00000000:19:00.0) on n2 at 1095 MHz of 1980: HW slowdown"]
    assert changes(now, now, "n2") == [], "said again without a change"
    assert changes(now, [gpu(0), gpu(1, **{"ecc.errors.uncorrected.volatile.total": "2"})], "n2") == [
        f"{CLOCKS} GPU 1 (00000000:19:00.0) on n2 at 1980 MHz of 1980: no slowdown now"]
    assert changes(None, [gpu(0, **{"ecc.errors.uncorrected.volatile.total": "5"})], "n2") == [], \
        "errors from before the run are the preflight's, not news"


def test_a_fault_counts_only_since_the_node_last_started():
    log = ("fsdpctl: node 1 of 2 on n2 in /r\n" f"{HARDWARE_FAULT} XID 79 on PCI 0000:3b:00 of n2: fallen off\n"
           "fsdpctl: n3 replaces n2 as node 1 for step 2\nfsdpctl: node 1 of 2 on n3 in /r\nstep=20 loss=3.1\n")
    assert fault_in_log(log) is None, "the replaced host's fault must not blame the spare"
    assert fault_in_log(log.split("fsdpctl: n3")[0]) == "XID 79 on PCI 0000:3b:00 of n2: fallen off"


def test_a_node_whose_watcher_said_a_fault_is_to_blame_for_a_program_error():
    nodes = [NodeStatus(node_rank=0, host="n1", state=NodeState.FAILED, exit_code=1),
             NodeStatus(node_rank=1, host="n2", state=NodeState.FAILED, exit_code=1)]
    assert nodes_to_blame(nodes) == {}
    assert nodes_to_blame(nodes, {"n2": "XID 79 ..."}) == {"n2": "hardware fault during the run: XID 79 ..."}


def test_the_watcher_samples_until_its_parent_ends(tmp_path):
    scenario = tmp_path / "gpu.json"
    bin_dir = fake_gpu.install(tmp_path / "bin", scenario)
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x18), fake_gpu.gpu(0x3B)])
    parent = subprocess.Popen(["sleep", "30"])
    out = tmp_path / "gpu" / "node1.jsonl"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    watcher = subprocess.Popen([sys.executable, "-m", "fsdpctl.node.gpu_watch", "--out", str(out), "--every", "1",
                                "--parent", str(parent.pid), "--node", "1", "--host", "n2"], env=env,
                               stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
            time.sleep(0.2)
        fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x18), fake_gpu.gpu(0x3B, **{
            "ecc.errors.uncorrected.volatile.total": 1})])
        lines = len(out.read_text().splitlines())
        while time.monotonic() < deadline and len(out.read_text().splitlines()) < lines + 2:
            time.sleep(0.2)
    finally:
        parent.kill()
        parent.wait()
    said, _ = watcher.communicate(timeout=10)
    assert watcher.returncode == 0, "the watcher leaves when its parent is gone"
    samples = read_samples([out.read_text()])
    assert len(samples) >= 3 and samples[0]["node"] == 1 and samples[0]["host"] == "n2"
    assert [g["bus_id"] for g in samples[0]["gpus"]] == ["00000000:18:00.0", "00000000:3B:00.0"]
    assert samples[0]["gpus"][0]["sm_mhz"] == 345.0 and samples[0]["gpus"][0]["reasons"] == []
    assert said.splitlines() == [f"{HARDWARE_FAULT} GPU 1 (00000000:3B:00.0) on n2: new uncorrectable ECC error(s), "
                                 "1 since the driver loaded"]


def test_the_watcher_asks_nothing_of_a_node_without_nvidia_smi(tmp_path):
    out = tmp_path / "gpu" / "node0.jsonl"
    done = subprocess.run([sys.executable, "-m", "fsdpctl.node.gpu_watch", "--out", str(out), "--parent", "1"],
                          env={"PATH": str(tmp_path), "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and done.stdout == "" and not out.parent.exists()


def sample(t, host, node, *gpus):
    return {"t": t, "host": host, "node": node, "gpus": list(gpus)}


def run_samples(slow_reason="HW slowdown", slow_clock=1095.0):
    out = []
    for t in range(10):
        out.append(sample(t, "n1", 0, gpu(0), gpu(1)))
        slowed = gpu(1, **{"clocks.sm": str(slow_clock)})
        if slow_reason:
            slowed["reasons"] = [slow_reason]
        out.append(sample(t, "n2", 1, gpu(0), slowed if t >= 3 else gpu(1)))
    return out


def test_the_straggler_cause_from_its_gpu_samples():
    samples = run_samples()
    assert gpu_cause(samples, "n2", [1]) == "GPU 1 on n2 at 1,095 MHz of 1,980: HW slowdown (in 7 of 10 samples)"
    assert gpu_cause(samples, "n2", [0]) is None and gpu_cause(samples, "n1", [0, 1]) is None
    quiet = run_samples(slow_reason=None)  # slower with no reason given: its clock against the others'
    assert gpu_cause(quiet, "n2", [1]) == ("GPU 1 on n2 ran at 1,095 MHz where the others ran at 1,980 "
                                           "(median SM clocks)")
    assert gpu_cause(run_samples(slow_reason=None, slow_clock=1900.0), "n2", [1]) is None


def test_each_node_now_and_over_the_run():
    samples = run_samples()
    latest = latest_by_node(samples)
    assert set(latest) == {0, 1}
    assert now_text(latest[1]) == ("2 GPU(s): SM 1095-1980 MHz, 60 C, 650 W, util 99 %; GPU 1 (00000000:19:00.0) "
                                   "HW slowdown at 1,095 MHz of 1,980")
    assert run_lines(samples) == [
        "GPUs on n1: 10 samples, SM median 1,980 MHz (lowest 1,980), hottest 60 C, util median 99 %",
        "GPUs on n2: 10 samples, SM median 1,980 MHz (lowest 1,095), hottest 60 C, util median 99 %; "
        "GPU 1 HW slowdown in 7"]
    assert read_samples(["not json\n" + json.dumps(samples[0])[:20], json.dumps(samples[0])]) == [samples[0]]


def test_status_reads_the_newest_samples_of_a_long_file(tmp_path):
    path = tmp_path / "node1.jsonl"
    path.write_text("".join(json.dumps(sample(t, "n2", 1, gpu(0))) + "\n" for t in range(3000)))
    newest = newest_samples([newest_text(path, limit=8 << 10)])
    assert [s["t"] for s in newest] == list(range(2976, 3000))
    assert newest_text(tmp_path / "none.jsonl") == ""
