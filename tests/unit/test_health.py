"""GPU and node health: the probe's part run against fake GPU tools (real subprocesses, the real
nvidia-smi's query language), and the verdicts on what it found."""

from __future__ import annotations

import subprocess

import pytest

from fsdpctl.hostcheck.health import health_checks
from fsdpctl.node import health_probe
from tests.testbed import fake_gpu

FULL = {"xid": True, "dcgm": True, "ib": True}


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node whose PATH starts with the fake tools; returns (scenario path, bin dir)."""
    scenario = tmp_path / "scenario.json"
    bin_dir = fake_gpu.install(tmp_path / "bin", scenario)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return scenario, bin_dir


def judged(spec=FULL, allow_busy=False, device="cuda"):
    facts = health_probe.health(spec)
    return facts, health_checks(facts, device, allow_busy, full=bool(spec.get("xid")))


def bad(checks):
    return [(c.name, c.status, c.gpu, c.detail) for c in checks if c.status != "pass"]


def test_the_fake_refuses_an_unknown_field_whole_as_the_real_one_does(node):
    scenario, bin_dir = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B)])
    out = subprocess.run([bin_dir / "nvidia-smi", "--query-gpu=index,bogus.field", "--format=csv"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and 'Field "bogus.field" is not a valid field to query.' in out.stdout


def test_healthy_gpus_name_nothing(node):
    scenario, _ = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B), fake_gpu.gpu(0x5E)])
    facts, checks = judged()
    assert [g["pci.bus_id"] for g in facts["gpus"]["gpus"]] == ["00000000:3B:00.0", "00000000:5E:00.0"]
    assert facts["gpus"]["missing"] == []
    assert bad(checks) == []
    assert {c.name for c in checks} == {"gpu-health", "gpu-busy", "xid", "dcgm"}


def test_each_fault_is_named_on_its_gpu_with_what_to_do(node):
    scenario, _ = node
    fake_gpu.write_scenario(scenario, [
        fake_gpu.gpu(0x18),
        fake_gpu.gpu(0x3B, **{"ecc.errors.uncorrected.volatile.total": 2, "ecc.errors.uncorrected.aggregate.total": 5}),
        fake_gpu.gpu(0x5E, **{"remapped_rows.pending": "Yes"}),
        fake_gpu.gpu(0x86, **{"clocks_event_reasons.hw_slowdown": "Active", "clocks_event_reasons.gpu_idle":
                              "Not Active", "clocks.sm": 1095}),
        fake_gpu.gpu(0xAF, **{"power.limit": "400.00", "pcie.link.width.current": 8, "compute_mode": "Prohibited"}),
    ])
    _, checks = judged()
    found = bad(checks)
    assert ("gpu-health", "fail", 1, "GPU 1 (00000000:3B:00.0): 2 uncorrectable ECC error(s) since the driver "
                                     "loaded") in found
    assert ("gpu-health", "fail", 2, "GPU 2 (00000000:5E:00.0): a memory row remap (page retirement) is "
                                     "pending") in found
    assert ("gpu-health", "fail", 3, "GPU 3 (00000000:86:00.0): HW slowdown active at 1095 MHz of 1980") in found
    assert {(g, s) for _, s, g, _ in found if g == 4} == {(4, "warn"), (4, "fail")}
    assert not [f for f in found if f[2] == 0], "the healthy GPU 0 is named"
    assert all(c.hint for c in checks if c.status != "pass")
    assert all(c.bus_id for c in checks if c.status != "pass")


def test_a_field_an_old_driver_lacks_is_skipped_not_failed(node):
    scenario, _ = node
    dropped = ["remapped_rows.pending", "remapped_rows.failure", "pcie.link.gen.gpucurrent"]
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B)], drop_fields=dropped)
    facts, checks = judged()
    assert set(facts["gpus"]["missing"]) == {"remapped_rows.pending", "remapped_rows.failure"}
    assert facts["gpus"]["gpus"][0]["pcie.link.gen.gpucurrent"] == "5", "the older name stands in"
    assert bad(checks) == []
    assert "not given by this driver: remapped_rows.pending, remapped_rows.failure" in checks[0].detail


def test_a_process_on_a_gpu_refuses_unless_allowed(node):
    scenario, _ = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B), fake_gpu.gpu(0x5E, **{"memory.used": 30000})],
                            apps=[{"pid": 4242, "process_name": "python", "used_memory": 30000,
                                   "gpu_bus_id": "00000000:5E:00.0", "gpu_uuid": "GPU-fake-5e"}])
    _, checks = judged(spec={})
    assert bad(checks) == [("gpu-busy", "fail", 1, "GPU 1 (00000000:5E:00.0): in use by pid 4242 (python, "
                                                   "30000 MiB)")]
    assert "--allow-busy-gpus" in next(c.hint for c in checks if c.status == "fail")
    _, allowed = judged(spec={}, allow_busy=True)
    assert [(c.name, c.status) for c in allowed if c.status != "pass"] == [("gpu-busy", "warn")]


def test_memory_in_use_with_no_process_listed_is_another_containers(node):
    scenario, _ = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B, **{"memory.used": 12000}), fake_gpu.gpu(0x5E)])
    _, checks = judged(spec={})
    assert [(n, g) for n, _, g, _ in bad(checks)] == [("gpu-busy", 0)]
    assert "12000 MiB in use by processes this host does not show" in bad(checks)[0][3]


def test_xid_errors_since_boot_are_named_on_their_gpu(node):
    scenario, _ = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B), fake_gpu.gpu(0x5E)], dmesg=[
        "[ 12.3] NVRM: loading NVIDIA UNIX Open Kernel Module",
        "[ 812.1] NVRM: Xid (PCI:0000:5e:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "[ 900.2] NVRM: Xid (PCI:0000:3b:00): 13, pid=77, Graphics Exception",
        "[ 901.2] NVRM: Xid (PCI:0000:3b:00): 13, pid=77, Graphics Exception"])
    _, checks = judged()
    assert bad(checks) == [
        ("xid", "warn", 0, "GPU 0 (00000000:3B:00.0): XID 13 (graphics engine exception) x2 since boot"),
        ("xid", "fail", 1, "GPU 1 (00000000:5E:00.0): XID 79 (GPU has fallen off the bus) x1 since boot")]


def test_an_unreadable_kernel_log_says_so_without_failing(node, tmp_path, monkeypatch):
    scenario, _ = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B)], dmesg_refused=True)
    monkeypatch.setattr(health_probe, "KMSG", str(tmp_path / "no-kmsg"))
    facts, checks = judged()
    assert facts["xid"]["readable"] is False
    xid = next(c for c in checks if c.name == "xid")
    assert xid.status == "pass" and "kernel log not readable here (dmesg: read kernel buffer failed" in xid.detail


def test_without_dmesg_the_kernel_record_device_is_read(node, tmp_path, monkeypatch):
    scenario, _ = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B)], dmesg_refused=True)
    kmsg = tmp_path / "kmsg"  # /dev/kmsg's record format: "prio,seq,usec,flags;text"
    kmsg.write_text("6,1,100,-;NVRM: loading\n3,2,200,-;NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE\n")
    monkeypatch.setattr(health_probe, "KMSG", str(kmsg))
    facts, checks = judged()
    assert facts["xid"]["source"] == str(kmsg)
    assert bad(checks) == [("xid", "fail", 0, "GPU 0 (00000000:3B:00.0): XID 48 (double-bit ECC error) x1 since boot")]


def test_dcgm_diag_failure_is_a_failure(tmp_path, monkeypatch):
    scenario = tmp_path / "scenario.json"
    bin_dir = fake_gpu.install(tmp_path / "bin", scenario, dcgmi=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B)], dcgmi_status=226,
                            dcgmi_output="| Memory | Fail - GPU 0: uncorrectable memory error |")
    _, checks = judged()
    dcgm = next(c for c in checks if c.name == "dcgm")
    assert dcgm.status == "fail" and "Memory Fail - GPU 0: uncorrectable memory error" in dcgm.detail


def test_no_nvidia_smi_warns_on_a_gpu_profile_and_is_silent_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert health_probe.health({})["gpus"] is None
    assert [c.status for c in health_checks({"gpus": None}, "cuda", full=False)] == ["warn"]
    assert health_checks({"gpus": None}, "cpu", full=False) == []


def test_a_driver_that_does_not_answer_fails(node):
    _, _ = node  # no scenario file: the fake fails as nvidia-smi does without a driver
    facts, checks = judged(spec={})
    assert "error" in facts["gpus"]
    assert bad(checks)[0][:2] == ("gpu-health", "fail")


def test_infiniband_error_counters_from_sysfs(tmp_path):
    for port, errors in (("mlx5_0/ports/1", {"symbol_error": "0", "link_downed": "0"}),
                         ("mlx5_1/ports/1", {"symbol_error": "17", "link_downed": "2", "port_rcv_errors": "0"})):
        base = tmp_path / port
        (base / "counters").mkdir(parents=True)
        (base / "state").write_text("4: ACTIVE\n")
        (base / "rate").write_text("400 Gb/sec (4X NDR)\n")
        for name, value in errors.items():
            (base / "counters" / name).write_text(value + "\n")
    ports = health_probe.ib_ports(str(tmp_path))
    assert ports["mlx5_1/1"]["counters"] == {"symbol_error": 17, "link_downed": 2, "port_rcv_errors": 0}
    checks = health_checks({"gpus": None, "ib": ports}, "cpu")
    assert [(c.name, c.status, c.detail) for c in checks] == [
        ("ib-health", "warn", "mlx5_1/1 (400 Gb/sec (4X NDR)): link_downed=2, symbol_error=17")]


def test_infiniband_rates_are_compared_across_hosts():
    from fsdpctl.hostcheck.checks import HostReport, judge_parity
    from fsdpctl.profiles.schema import ClusterProfile

    def host(name, rate):
        facts = {"torch": {}, "python": {"version": "3.11.7"}, "gpus": {}, "interfaces": {},
                 "health": {"ib": {"mlx5_0/1": {"rate": rate, "counters": {}}}}}
        return HostReport(host=name, node_rank=0, facts=facts)

    entries = {e.fact: e for e in judge_parity(ClusterProfile(name="p"), [
        host("n1", "400 Gb/sec (4X NDR)"), host("n2", "400 Gb/sec (4X NDR)"), host("n3", "200 Gb/sec (4X HDR)")])}
    assert entries["ib_rate"].status == "fail"
    assert entries["ib_rate"].detail == "differs on n3=200 Gb/sec (4X HDR) (others: 400 Gb/sec (4X NDR))"


def test_only_the_runs_own_gpus_are_judged(node):
    """hosts[].gpus: [0] on a shared box: another user's process and an XID on GPU 1 are not this run's."""
    from fsdpctl.hostcheck.health import judge_health

    scenario, _ = node
    fake_gpu.write_scenario(scenario, [fake_gpu.gpu(0x3B), fake_gpu.gpu(0x5E, **{"memory.used": 30000})],
                            apps=[{"pid": 4242, "process_name": "python", "used_memory": 30000,
                                   "gpu_bus_id": "00000000:5E:00.0", "gpu_uuid": "GPU-fake-5e"}],
                            dmesg=["[ 812.1] NVRM: Xid (PCI:0000:5e:00): 79, pid=1234, GPU has fallen off the bus."])
    facts = {"health": health_probe.health(FULL)}
    asked = {**FULL, "allow_busy": False}
    assert bad(judge_health("cuda", facts, asked, chosen=(0,))) == []
    assert [(n, s, g) for n, s, g, _ in bad(judge_health("cuda", facts, asked, chosen=(1,)))] == [
        ("gpu-busy", "fail", 1), ("xid", "fail", 1)]
    assert len(bad(judge_health("cuda", facts, asked))) == 2  # no choice: every GPU
