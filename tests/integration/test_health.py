"""Health before a run, on the namespace testbed: every host's GPUs through a fake nvidia-smi on its
own PATH (faults named on their host and nowhere else, busy GPUs refusing a launch), hosts with a
fault excluded, a node slowed by busy loops on its core (and its rank held off the CPU half the time)
named by the compute check, and a link slowed with tc named by the link check; even hosts and links
name nobody, run after run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.integration.conftest import doctor_json, require_netns, run_in_client
from tests.integration.test_launch import run_dir_of, start
from tests.testbed import fake_gpu
from tests.testbed.lab import Lab
from tests.testbed.throttle import Throttle

NAMES = ["g1", "g2", "g3", "g4"]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gpu_lab(tmp_path_factory):
    """Four hosts, each with its own fake GPU tools first on PATH (answering from ``<host>/gpu.json``)."""
    require_netns()
    lab = Lab(tmp_path_factory.mktemp("gpulab"), NAMES).up()
    try:
        for name in NAMES:
            host = lab.hosts[name]
            bin_dir = fake_gpu.install(host.dir / "bin", host.dir / "gpu.json", dcgmi=name == "g2")
            lab.start_sshd(name, f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n")
        yield lab
    finally:
        lab.down()


def healthy(lab: Lab) -> None:
    for name in NAMES:
        fake_gpu.write_scenario(lab.hosts[name].dir / "gpu.json", [fake_gpu.gpu(0x18), fake_gpu.gpu(0x3B)])


def failing(data: dict) -> dict[str, list[tuple[str, str, int | None]]]:
    """Per host, the (check, status, GPU) of every check that did not pass."""
    return {h["host"]: [(c["name"], c["status"], c.get("gpu")) for c in h["checks"] if c["status"] != "pass"]
            for h in data["hosts"]}


def profile(lab: Lab, names: list[str], extra: str = "") -> str:
    return lab.profile_yaml(names, python=sys.executable, extra=extra)


def test_each_fault_is_named_on_its_host_and_nowhere_else(gpu_lab, tmp_path):
    healthy(gpu_lab)
    at = {name: gpu_lab.hosts[name] for name in NAMES}
    fake_gpu.write_scenario(at["g2"].dir / "gpu.json", [
        fake_gpu.gpu(0x18, **{"ecc.errors.uncorrected.volatile.total": 3}),
        fake_gpu.gpu(0x3B, **{"remapped_rows.pending": "Yes"})],
        dcgmi_status=226, dcgmi_output="| Memory | Fail - GPU 0: uncorrectable memory error |")
    fake_gpu.write_scenario(at["g3"].dir / "gpu.json", [
        fake_gpu.gpu(0x18), fake_gpu.gpu(0x3B, **{"clocks_event_reasons.hw_slowdown": "Active",
                                                 "clocks_event_reasons.gpu_idle": "Not Active", "clocks.sm": 1095})],
        drop_fields=["remapped_rows.pending", "remapped_rows.failure", "retired_pages.pending"])
    fake_gpu.write_scenario(at["g4"].dir / "gpu.json", [fake_gpu.gpu(0x18), fake_gpu.gpu(0x3B)],
                            apps=[{"pid": 31337, "process_name": "other-users-job", "used_memory": 40000,
                                   "gpu_bus_id": "00000000:18:00.0", "gpu_uuid": "GPU-fake-18"}],
                            dmesg=["[ 99.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."])
    rc, data, _ = doctor_json(gpu_lab, tmp_path, profile(gpu_lab, NAMES), "--health")
    assert rc == 1
    found = failing(data)
    address = {name: at[name].address for name in NAMES}
    assert found[address["g1"]] == []
    assert sorted(found[address["g2"]]) == [("dcgm", "fail", None), ("gpu-health", "fail", 0),
                                            ("gpu-health", "fail", 1)]
    assert found[address["g3"]] == [("gpu-health", "fail", 1)]
    assert sorted(found[address["g4"]]) == [("gpu-busy", "fail", 0), ("xid", "fail", 1)]
    g3 = next(h for h in data["hosts"] if h["host"] == address["g3"])
    assert "HW slowdown active at 1095 MHz of 1980" in next(c["detail"] for c in g3["checks"] if c["status"] == "fail")
    assert set(g3["facts"]["health"]["gpus"]["missing"]) == {"remapped_rows.pending", "remapped_rows.failure",
                                                              "retired_pages.pending"}
    g4 = next(h for h in data["hosts"] if h["host"] == address["g4"])
    busy = next(c for c in g4["checks"] if c["name"] == "gpu-busy")
    assert busy["bus_id"] == "00000000:18:00.0" and "pid 31337 (other-users-job, 40000 MiB)" in busy["detail"]


def test_healthy_fakes_name_nobody_run_after_run(gpu_lab, tmp_path):
    healthy(gpu_lab)
    for _ in range(3):
        rc, data, _ = doctor_json(gpu_lab, tmp_path, profile(gpu_lab, NAMES), "--health")
        assert rc == 0 and all(not bad for bad in failing(data).values()), failing(data)


def test_a_busy_gpu_stops_the_launch_unless_allowed(gpu_lab, tmp_path):
    healthy(gpu_lab)
    fake_gpu.write_scenario(gpu_lab.hosts["g2"].dir / "gpu.json", [fake_gpu.gpu(0x18)], apps=[
        {"pid": 4242, "process_name": "python", "used_memory": 30000, "gpu_bus_id": "00000000:18:00.0",
         "gpu_uuid": "GPU-fake-18"}])
    code = tmp_path / "code"
    code.mkdir()
    (code / "hello.py").write_text("import os\nprint('hello from', os.environ['FSDPCTL_HOST'], flush=True)\n")
    path = tmp_path / "lab.yaml"
    path.write_text(profile(gpu_lab, ["g1", "g2"]))
    refused = run_in_client(gpu_lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--", "hello.py")
    assert refused.returncode != 0
    assert f"FAIL {gpu_lab.hosts['g2'].address} gpu-busy: GPU 0 (00000000:18:00.0): in use by pid 4242" \
        in refused.stdout + refused.stderr
    assert "nothing was started" in refused.stderr
    allowed = run_in_client(gpu_lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--allow-busy-gpus",
                            "--", "hello.py")
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert f"hello from {gpu_lab.hosts['g2'].address}" in allowed.stdout


def test_a_host_with_a_fault_is_excluded_and_a_spare_takes_its_place(gpu_lab, tmp_path):
    healthy(gpu_lab)
    fake_gpu.write_scenario(gpu_lab.hosts["g2"].dir / "gpu.json", [fake_gpu.gpu(0x18, **{
        "remapped_rows.failure": "Yes"})])
    spare = gpu_lab.hosts["g3"]
    text = profile(gpu_lab, ["g1", "g2"], extra=f"spares:\n  - host: {spare.address}\n    port: {spare.port}\n")
    rc, data, err = doctor_json(gpu_lab, tmp_path, text, "--health", "--exclude-unhealthy")
    assert rc == 1
    g2 = gpu_lab.hosts["g2"].address
    assert f"doctor: {g2} excluded from profile lab (doctor --health: GPU 0 (00000000:18:00.0): row remapping " \
           "failed" in err
    shown = run_in_client(gpu_lab, tmp_path, "hosts", "-p", str(tmp_path / "lab.yaml"), "--json")
    roles = {h["host"]: h["role"] for h in json.loads(shown.stdout)}
    assert roles == {gpu_lab.hosts["g1"].address: "active", spare.address: "active", g2: "excluded"}
    # Put back only once its GPUs pass: the re-check asks them too.
    refused = run_in_client(gpu_lab, tmp_path, "hosts", "-p", str(tmp_path / "lab.yaml"), "--restore", g2)
    assert refused.returncode != 0 and "row remapping failed" in refused.stderr, refused.stderr[-2000:]
    healthy(gpu_lab)
    restored = run_in_client(gpu_lab, tmp_path, "hosts", "-p", str(tmp_path / "lab.yaml"), "--restore", g2)
    assert restored.returncode == 0, restored.stderr[-2000:]


# ---- during a run -------------------------------------------------------------------------------

FAULTED = """\
import os, sys, time
from pathlib import Path
attempt, node = int(os.environ["FSDPCTL_ATTEMPT"]), int(os.environ["FSDPCTL_NODE_RANK"])
print(f"attempt {attempt} node {node} on {os.environ['FSDPCTL_HOST']}", flush=True)
deadline = time.time() + 90
while attempt == 1 and not Path(sys.argv[1]).exists() and time.time() < deadline:
    time.sleep(0.2)
if attempt == 1 and node == 1:  # what a rank raises when its GPU fell off the bus: a program error to torch
    raise SystemExit("CUDA error: unspecified launch failure")
print(f"done on {os.environ['FSDPCTL_HOST']}", flush=True)
"""


def test_a_hardware_xid_during_a_run_is_said_at_once_and_its_host_is_replaced(gpu_lab, tmp_path):
    healthy(gpu_lab)
    g1, g2, g3 = (gpu_lab.hosts[n] for n in ("g1", "g2", "g3"))
    code, flag = tmp_path / "code", tmp_path / "fail-now"
    code.mkdir()
    (code / "faulted.py").write_text(FAULTED)
    path = tmp_path / "lab.yaml"
    path.write_text(profile(gpu_lab, ["g1", "g2"], extra=f"spares:\n  - host: {g3.address}\n    port: {g3.port}\n"
                                                        "max_restarts: 1\nhealth:\n  sample_seconds: 1\n"))
    launched = start(gpu_lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--", "faulted.py", str(flag))
    try:
        samples = run_dir_of(tmp_path) / "gpu" / "node1.jsonl"
        deadline = time.monotonic() + 60
        while not samples.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        fake_gpu.write_scenario(g2.dir / "gpu.json", [fake_gpu.gpu(0x18), fake_gpu.gpu(0x3B)], dmesg=[
            "[ 812.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."])
        time.sleep(3)  # the watcher samples every second
        flag.touch()
        rc, out, err = launched.finish(timeout=240)
    finally:
        healthy(gpu_lab)
    assert rc == 0, (out[-3000:], err[-3000:])
    said = f"fsdpctl: hardware fault: XID 79 on PCI 0000:3b:00 of {g2.address}: pid=1234, name=python, GPU has " \
           "fallen off the bus."
    assert said in out, out[-3000:]
    assert f"{g3.address} replaces {g2.address} for attempt 2: hardware fault during the run: XID 79" in err
    assert f"done on {g1.address}" in out and f"done on {g3.address}" in out
    shown = run_in_client(gpu_lab, tmp_path, "hosts", "-p", str(path), "--json")
    excluded = {h["host"]: h.get("reason") for h in json.loads(shown.stdout) if h["role"] == "excluded"}
    assert list(excluded) == [g2.address] and "XID 79" in excluded[g2.address]


# ---- measured: compute and links ------------------------------------------------------------------

def pin(pid: int, cpus: str) -> None:
    """Move a process and every thread of it to ``cpus`` (its future children inherit it)."""
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True)


def test_a_node_slowed_by_busy_loops_on_its_core_is_named_by_the_compute_check(gpu_lab, tmp_path):
    healthy(gpu_lab)
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs: one node's core is loaded, the other's is not")
    first, second = sorted(cpus)[:2]
    g1, g2 = gpu_lab.hosts["g1"], gpu_lab.hosts["g2"]
    text = profile(gpu_lab, ["g1", "g2"])
    loops: list[subprocess.Popen] = []
    try:
        # An even pair: nobody named, in two checks of at most three. Neither node is pinned: a parallel CI
        # worker's load that fell on one pinned core made its node the slower one and named it (CI), in a
        # pair meant to be even. Unpinned, a burst of that load on one rank's core for the whole 2 s window
        # still named it once (CI), so one check of three may name a node; a check that names
        # a healthy node every time fails here.
        verdicts = []
        while verdicts.count("even") < 2 and len(verdicts) < 3:
            rc, data, err = doctor_json(gpu_lab, tmp_path, text, "--compute")
            statuses = [c["status"] for h in data.get("hosts", []) for c in h["checks"] if c["name"] == "compute"]
            assert len(statuses) == 2, (err[-2000:], data.get("compute"))
            verdicts.append("even" if rc == 0 and statuses == ["pass", "pass"] else str(data.get("compute")))
        assert verdicts.count("even") == 2, verdicts
        pin(g1.pid, str(first))  # each node's ranks on a core of their own, as on two machines
        pin(g2.pid, str(second))
        loops = [subprocess.Popen(["taskset", "-c", str(second), sys.executable, "-c", "while True: pass"])
                 for _ in range(2)]
        # The other tests of a parallel session load both cores too, and g1's rank can get a small share of
        # its core (CI: with g2 held off half the time, g1 came out less than 1.5x faster; nobody named).
        # So g2's rank (global rank 1: c10d orders the nodes by address) is also held off the CPU 85% of
        # the time, as a throttled GPU is: at most 1/20 of a core, whatever else runs.
        throttle = Throttle(gpu_lab.root, rank=1, module="fsdpctl.workload.compute_check", held=0.85)
        try:
            rc, data, err = doctor_json(gpu_lab, tmp_path, text, "--compute")
        finally:
            throttle.stop()
        assert throttle.pid is not None, "g2's rank was never found to slow down"
        assert rc == 1, data.get("compute")
        verdict = {h["host"]: next(c for c in h["checks"] if c["name"] == "compute") for h in data["hosts"]}
        assert verdict[g1.address]["status"] == "pass"
        assert verdict[g2.address]["status"] == "fail" and "local rank 0 at 0." in verdict[g2.address]["detail"]
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
        everything = ",".join(str(c) for c in sorted(cpus))
        pin(g1.pid, everything)
        pin(g2.pid, everything)


def shape(lab: Lab, name: str, rate: str | None) -> None:
    """Limit (or free) one host's link both ways: its eth0 and its port on the switch (tbf: netem is
    not in this kernel)."""
    host = lab.hosts[name]
    for namespace, device in ((host.namespace, "eth0"), (lab.switch_ns, f"p{host.index}")):
        if rate is None:
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", device, "root"],
                           capture_output=True)
        else:
            subprocess.run(["ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", device, "root",
                            "tbf", "rate", rate, "burst", "64kb", "latency", "200ms"], check=True)


def test_a_slowed_link_is_named_and_even_links_name_nobody(gpu_lab, tmp_path):
    healthy(gpu_lab)
    text = profile(gpu_lab, NAMES)
    for _ in range(2):
        rc, data, err = doctor_json(gpu_lab, tmp_path, text, "--links")
        print("\n" + "\n".join(data.get("links", {}).get("verdict", [])))
        assert rc == 0, (err[-2000:], data.get("links"))
        assert data["links"]["rounds"] == 3 and len(data["links"]["pairs"]) == 6
        assert all(c["status"] == "pass" for h in data["hosts"] for c in h["checks"] if c["name"] == "links")
    try:
        shape(gpu_lab, "g3", "200mbit")
        plots = tmp_path / "plots"
        result = run_in_client(gpu_lab, tmp_path, "doctor", "-p", str(tmp_path / "lab.yaml"), "--links",
                               "--plot", str(plots), timeout=300)
    finally:
        shape(gpu_lab, "g3", None)
    assert result.returncode == 1, result.stdout[-3000:]
    slow = gpu_lab.hosts["g3"].address
    assert f"FAIL {slow} links: the slow link" in result.stdout
    assert "3 of its 3 pairs are slow; each measured twice" in result.stdout, result.stdout[-3000:]
    for other in ("g1", "g2", "g4"):  # their pairs with g3 are g3's, not theirs
        assert f" {gpu_lab.hosts[other].address} links" not in result.stdout, result.stdout[-3000:]
    assert (plots / "links.png").stat().st_size > 0  # matplotlib: the test extra has it
