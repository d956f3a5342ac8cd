"""The probe on a node that lacks the optional tools: every fact has a source that needs no tool,
so a missing ``ip`` or ``nvidia-smi`` never turns into a false FAIL.

The probe's subprocesses are exactly ``ip`` and ``nvidia-smi`` (``test_the_probe_starts_only_these_tools``);
each test runs the real probe with a PATH that holds only the stand-ins it wants.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from fsdpctl.hostcheck.checks import HostReport, judge_host, judge_parity
from fsdpctl.hostcheck.probe import parse_probe_output
from fsdpctl.profiles.loader import parse_profile
from tests.conftest import REPO

PROBE = REPO / "fsdpctl" / "hostcheck" / "probe_script.py"


def probe(tmp_path: Path, tools: dict[str, str], args: dict | None = None) -> dict:
    """Run the probe with only ``tools`` (name -> shell script body) on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    done = subprocess.run([sys.executable, str(PROBE), json.dumps(args or {"interface": "lo"})],
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return parse_probe_output(done.stdout)


def test_the_probe_starts_only_these_tools():
    started = set()
    for node in ast.walk(ast.parse(PROBE.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run":
            argv = node.args[0]
            assert isinstance(argv, ast.List), "a subprocess command must be a literal argument list"
            started.add(argv.elts[0].value)
    assert started == {"ip", "nvidia-smi"}


def test_without_ip_the_addresses_come_from_the_kernel(tmp_path):
    facts = probe(tmp_path, {})
    lo = facts["interfaces"]["lo"]
    assert lo["ipv4"] == ["127.0.0.1/8"] and lo["ipv4_source"] == "ioctl"
    assert lo["up"] is True and lo["mtu"] > 0
    assert facts["tools"]["ip"] is None and facts["tools"]["nvidia-smi"] is None
    checks = {c.name: c for c in judge_host(profile("lo"), facts, nproc=1)}
    assert checks["interface"].status == "pass" and "127.0.0.1/8" in checks["interface"].detail


def test_an_ip_that_fails_or_prints_junk_is_not_believed(tmp_path):
    for body in ("exit 1", "echo 'Object \"addr\" is unknown'; exit 255", "echo '{not json'"):
        facts = probe(tmp_path, {"ip": body})
        assert facts["interfaces"]["lo"]["ipv4"] == ["127.0.0.1/8"], body
        assert facts["interfaces"]["lo"]["ipv4_source"] == "ioctl"


def test_with_ip_every_address_it_lists_is_used(tmp_path):
    listing = [{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8},
                                              {"family": "inet", "local": "127.0.0.2", "prefixlen": 8}]}]
    facts = probe(tmp_path, {"ip": f"echo '{json.dumps(listing)}'"})
    assert facts["interfaces"]["lo"]["ipv4"] == ["127.0.0.1/8", "127.0.0.2/8"]
    assert facts["interfaces"]["lo"]["ipv4_source"] == "ip" and facts["tools"]["ip"]


def test_nvidia_smi_counts_gpus_when_present_and_its_absence_fails_nothing(tmp_path):
    smi = "echo 'NVIDIA H100 80GB HBM3, 580.65.06'; echo 'NVIDIA H100 80GB HBM3, 580.65.06'"
    facts = probe(tmp_path, {"nvidia-smi": smi})
    assert facts["gpus"]["count"] == 2 and facts["gpus"]["driver"] == "580.65.06"
    assert facts["gpus"]["source"] == "nvidia-smi"
    without = probe(tmp_path / "none", {})
    assert without["gpus"]["source"] in (None, "/proc/driver/nvidia/gpus", "/dev")  # this machine's own view
    assert without["gpus"]["count"] == 0 if without["gpus"]["source"] is None else without["gpus"]["count"] > 0
    cpu_checks = {c.name: c.status for c in judge_host(profile("lo"), without, nproc=1)}
    assert "fail" not in cpu_checks.values(), cpu_checks


def profile(interface: str, device: str = "cpu"):
    return parse_profile(f"name: p\nbackend: ssh\nhosts: [a, b]\nnproc_per_node: 1\ndevice: {device}\n"
                         f"network:\n  interface: {interface}\n", "p.yaml")


def test_facts_a_node_could_not_read_are_warnings():
    base = {"python": {"path": "/usr/bin/python3", "version": "3.12.3"},
            "torch": {"installed": True, "version": "2.11.0", "cuda": None, "fsdp2_exported": True},
            "gpus": {"count": 0, "driver": None}, "infiniband": {}}
    unknown_address = {**base, "interfaces": {"eth0": {"state": "up", "up": True, "mtu": 1500, "ipv4": None,
                                                       "unknown": "ioctl failed: Operation not permitted"}}}
    unknown_state = {**base, "interfaces": {"eth0": {"state": "unknown", "up": None, "mtu": None,
                                                     "ipv4": ["10.0.0.1/24"], "unknown": "no AF_INET socket"}}}
    for facts, words in ((unknown_address, "its IPv4 address is unknown (ioctl failed"),
                         (unknown_state, "whether it is up is unknown (no AF_INET socket)")):
        check = next(c for c in judge_host(profile("eth0"), facts, nproc=1) if c.name == "interface")
        assert check.status == "warn" and words in check.detail, check


def test_parity_rows_say_something_on_cpu_hosts(tmp_path):
    facts = probe(tmp_path, {}, {"interface": "lo", "packages": ["torch", "numpy", "tokenizers"]})
    reports = [HostReport(host=h, node_rank=i, facts=facts) for i, h in enumerate(("a", "b"))]
    entries = judge_parity(profile("lo"), reports)
    assert entries and all("None" not in e.detail for e in entries), [e.detail for e in entries]
    facts_with_cuda = {e.fact for e in entries}
    assert {"cuda_runtime", "nccl", "driver_major"}.isdisjoint(facts_with_cuda)  # no host has them
    assert {"torch", "python", "numpy", "tokenizers"} <= facts_with_cuda
