"""Doctor's judgement on probe facts, the probe's output parsing, and the real probe on this machine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpctl.errors import PreflightError
from fsdpctl.hostcheck.checks import DoctorReport, HostReport, judge_host, judge_parity
from fsdpctl.hostcheck.probe import ProbeOutputError, parse_probe_output, probe_command
from fsdpctl.profiles.loader import parse_profile


def profile(extra: str = "", device: str = "cpu"):
    return parse_profile(f"name: p\nbackend: ssh\nhosts: [a, b, c]\nnproc_per_node: 2\ndevice: {device}\n"
                         f"network:\n  interface: eth0\n{extra}", "p.yaml")


def facts(**overrides):
    base = {
        "python": {"path": "/usr/bin/python3", "version": "3.11.7"},
        "torch": {"installed": True, "version": "2.13.0", "cuda": "12.8", "fsdp2_exported": True,
                  "nccl": {"version": "2.27.3", "source": "nvidia-nccl-cu12"}},
        "gpus": {"count": 8, "driver": "570.86.15", "names": []},
        "interfaces": {"eth0": {"state": "up", "up": True, "mtu": 9000, "ipv4": ["10.0.0.1/24"]}},
        "infiniband": {}, "shm": {"path": "/dev/shm", "free_bytes": 8 << 30, "total_bytes": 8 << 30},
        "disk": {"path": "/", "free_bytes": 100 << 30, "total_bytes": 200 << 30},
    }
    base.update(overrides)
    return base


def statuses(checks):
    return {c.name: c.status for c in checks}


def test_healthy_host_passes_everything():
    result = statuses(judge_host(profile(device="cuda"), facts(), nproc=2))
    assert set(result.values()) == {"pass"}
    assert {"python", "torch", "fsdp2", "gpus", "interface", "infiniband"} <= set(result)


@pytest.mark.parametrize(("change", "check", "status"), [
    ({"torch": {"installed": False}}, "torch", "fail"),
    ({"gpus": {"count": 1, "driver": "570"}}, "gpus", "fail"),
    ({"interfaces": {"eth1": {"state": "up", "up": True, "mtu": 1500, "ipv4": ["10.0.0.1/24"]}}}, "interface", "fail"),
    ({"interfaces": {"eth0": {"state": "down", "up": False, "mtu": 1500, "ipv4": []}}}, "interface", "fail"),
    ({"interfaces": {"eth0": {"state": "up", "up": True, "mtu": 1500, "ipv4": []}}}, "interface", "fail"),
    ({"infiniband": {"mlx5_0": {"1": {"state": "4: ACTIVE"}}}}, "infiniband", "warn"),
    ({"shm": {"path": "/dev/shm", "free_bytes": 64 << 20, "total_bytes": 64 << 20}}, "shm", "warn"),
    ({"disk": {"path": "/", "free_bytes": 1 << 30, "total_bytes": 2 << 30}}, "disk", "warn"),
    ({"listen": {"port": 29500, "free": False, "error": "Address in use", "peers": []}}, "port", "fail"),
    ({"connect": {"addr": "10.0.0.1", "port": 29500, "reached": False, "error": "refused"}}, "port", "fail"),
])
def test_each_problem_is_judged(change, check, status):
    checks = judge_host(profile(device="cuda"), facts(**change), nproc=2)
    found = [c for c in checks if c.name == check]
    assert found and found[0].status == status, checks
    assert found[0].hint


@pytest.mark.parametrize(("stacks", "status", "words"), [
    ({"py_spy": None, "ptrace_scope": 1, "root": False}, "pass", "no py-spy for native frames"),
    ({"py_spy": "/v/bin/py-spy", "ptrace_scope": 1, "root": False}, "warn", "cannot attach (kernel.yama"),
    ({"py_spy": "/v/bin/py-spy", "ptrace_scope": 1, "root": True}, "pass", "py-spy /v/bin/py-spy (native frames too)"),
    ({"py_spy": "/v/bin/py-spy", "ptrace_scope": 3, "root": True}, "warn", "ptrace_scope=3"),
])
def test_doctor_says_how_stacks_will_be_read(stacks, status, words):
    (check,) = [c for c in judge_host(profile(), facts(stacks=stacks), nproc=2) if c.name == "stacks"]
    assert check.status == status and words in check.detail, check


def test_ib_true_needs_an_active_port():
    ib = profile("  ib: true\n", device="cuda")
    assert statuses(judge_host(ib, facts(), 2))["infiniband"] == "fail"
    active = facts(infiniband={"mlx5_0": {"1": {"state": "4: ACTIVE", "rate": "400", "link_layer": "InfiniBand"}}})
    assert statuses(judge_host(ib, active, 2))["infiniband"] == "pass"


def test_parity_names_the_odd_host_and_passes_when_equal():
    reports = [HostReport(h, i, facts()) for i, h in enumerate("abc")]
    assert {p.fact: p.status for p in judge_parity(profile(), reports)} == {
        "torch": "pass", "cuda_runtime": "pass", "nccl": "pass", "python": "pass", "driver_major": "pass",
        "mtu": "pass"}
    odd = facts(torch={"installed": True, "version": "2.12.0", "cuda": "12.8", "fsdp2_exported": True,
                       "nccl": {"version": "2.26.2"}})
    reports[2] = HostReport("c", 2, odd)
    entries = {p.fact: p for p in judge_parity(profile(), reports)}
    assert entries["torch"].status == "fail" and "c=2.12.0" in entries["torch"].detail

    assert "a=" not in entries["torch"].detail
    assert entries["nccl"].status == "fail" and entries["python"].status == "pass"
    # a host without the card fails its own interface check; its MTU is no parity row ("not installed")
    reports[2] = HostReport("c", 2, facts(interfaces={"eth1": {"state": "up", "up": True, "mtu": 1500,
                                                                "ipv4": ["10.0.0.3/24"]}}))
    assert {p.fact: p.status for p in judge_parity(profile(), reports)}["mtu"] == "pass"
    reports[2] = HostReport("c", 2, facts(interfaces={"eth0": {"state": "up", "up": True, "mtu": 1500,
                                                                "ipv4": ["10.0.0.3/24"]}}))
    mtu = {p.fact: p for p in judge_parity(profile(), reports)}["mtu"]
    assert mtu.status == "fail" and "c=1500" in mtu.detail and "ip link set dev CARD mtu" in mtu.hint


def test_missing_packages_fail_with_the_install_command_and_versions_are_compared():
    ready = facts(packages={"torch": "2.13.0", "numpy": "2.1.0", "tokenizers": "0.23.3"})
    bare = facts(packages={"torch": "2.13.0", "numpy": None, "tokenizers": None},
                 python={"path": "/opt/venv/bin/python3", "version": "3.11.7"})
    older = facts(packages={"torch": "2.13.0", "numpy": "1.26.4", "tokenizers": "0.23.3"})
    needs = ("torch", "numpy", "tokenizers")
    check = next(c for c in judge_host(profile(), bare, 2, needs) if c.name == "packages")
    assert check.status == "fail"
    assert check.detail == "numpy: not installed; tokenizers: not installed (for /opt/venv/bin/python3)"
    assert check.hint == "/opt/venv/bin/python3 -m pip install numpy tokenizers"
    assert statuses(judge_host(profile(), ready, 2, needs))["packages"] == "pass"
    versions = ("numpy>=2,<3", "tokenizers==0.23.3")
    assert statuses(judge_host(profile(), ready, 2, versions))["packages"] == "pass"
    old = next(c for c in judge_host(profile(), older, 2, ("numpy>=2",)) if c.name == "packages")
    assert old.status == "fail" and old.detail.startswith("numpy>=2: 1.26.4 installed")
    assert old.hint == "/usr/bin/python3 -m pip install 'numpy>=2'"
    # a marker that leaves the requirement out on this Python
    assert statuses(judge_host(profile(), bare, 2, ('numpy; python_version < "3.0"',)))["packages"] == "pass"
    entries = {p.fact: p for p in judge_parity(profile(), [HostReport("a", 0, ready), HostReport("b", 1, ready),
                                                           HostReport("c", 2, older), HostReport("d", 3, bare)])}
    assert entries["numpy"].status == "fail"
    assert entries["numpy"].detail == "differs on c=1.26.4, d=not installed (others: 2.1.0)"
    assert entries["tokenizers"].detail == "differs on d=not installed (others: 0.23.3)"


def test_a_failed_preflight_says_what_failed_where_in_its_last_line():
    bare = facts(torch={"installed": False}, packages={"numpy": None},
                 python={"path": "/v/bin/python", "version": "3.11.7"})
    torch = next(c for c in judge_host(profile(), bare, 2, ("numpy",)) if c.name == "torch")
    assert torch.detail == "torch is not installed for /v/bin/python"
    assert torch.hint.startswith("/v/bin/python -m pip install torch (the build for this node's CUDA")
    hosts = [HostReport(h, i, bare, judge_host(profile(), bare, 2, ("numpy",))) for i, h in enumerate("abcd")]
    hosts[0] = HostReport("a", 0, facts(), judge_host(profile(), facts(), 2))
    report = DoctorReport("p", hosts, [], 0.1)
    assert report.failing() == "b: torch, packages; c: torch, packages; d: torch, packages"
    assert report.failing(most=1) == "b: torch, packages; 2 more"
    error = PreflightError(report)
    assert error.message == "preflight failed; nothing was started"
    assert error.hint == ("fix what the report names (b: torch, packages; c: torch, packages; d: torch, packages), "
                          "or skip the checks: --no-preflight, preflight=False")
    assert DoctorReport("p", hosts[:1], [], 0.1).failing() == ""


def test_parse_ignores_noise_around_the_sentinels():
    noisy = 'motd {"x": 1}\n<<<FSDPCTL-PROBE-END>>>\n<<<FSDPCTL-PROBE-BEGIN>>>\n{"hostname": "n1"}\n' \
            "<<<FSDPCTL-PROBE-END>>>\nbye\n"
    assert parse_probe_output(noisy) == {"hostname": "n1"}
    with pytest.raises(ProbeOutputError):
        parse_probe_output("no answer at all")
    with pytest.raises(ProbeOutputError):
        parse_probe_output("<<<FSDPCTL-PROBE-BEGIN>>>\n{broken\n<<<FSDPCTL-PROBE-END>>>")


def test_real_probe_on_this_machine_reads_torch_without_importing_it():
    command = probe_command(sys.executable, {"workdir": "/tmp", "interface": "lo", "deep": False})
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = parse_probe_output(done.stdout)
    import torch  # noqa: PLC0415 - only to compare with what the probe read from files

    assert found["torch"]["version"] == torch.__version__
    assert found["torch"]["fsdp2_exported"] is True
    assert found["interfaces"]["lo"]["up"] is True and "127.0.0.1/8" in found["interfaces"]["lo"]["ipv4"]
    assert found["python"]["version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert found["probe_seconds"] < 1.0  # no `import torch` in the default probe
    beside = Path(sys.executable).parent / "py-spy"
    assert found["stacks"]["py_spy"] == (str(beside) if beside.exists() else shutil.which("py-spy"))
    assert "deep" not in found
    assert json.dumps(found)


def test_local_doctor_command_passes(tmp_path):
    from tests.conftest import run_cli

    result = run_cli("doctor", "-p", "local", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is True and data["hosts"][0]["host"] == "localhost"
