"""fsdpctl doctor against real sshd hosts in network namespaces, run from a client namespace."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import FAKE_TORCH_VERSION, doctor_json, run_in_client

pytestmark = pytest.mark.integration


def checks_of(host: dict) -> dict[str, dict]:
    return {c["name"]: c for c in host["checks"]}


def parity(data: dict) -> dict[str, dict]:
    return {p["fact"]: p for p in data["parity"]}


def test_two_alike_hosts_pass(lab, tmp_path):
    rc, data, err = doctor_json(lab, tmp_path, lab.profile_yaml(["n1", "n2"], python=sys.executable))
    assert rc == 0, (data, err)
    assert data["ok"] is True and [h["host"] for h in data["hosts"]] == [lab.hosts["n1"].address,
                                                                       lab.hosts["n2"].address]
    for host in data["hosts"]:
        checks = checks_of(host)
        for name in ("reachable", "python", "torch", "fsdp2", "interface", "infiniband", "port"):
            assert checks[name]["status"] == "pass", checks
    # Each probe really ran on its own host: own hostname, own eth0 address.
    assert [h["facts"]["hostname"] for h in data["hosts"]] == ["n1", "n2"]
    assert data["hosts"][1]["facts"]["interfaces"]["eth0"]["ipv4"] == [f"{lab.hosts['n2'].address}/24"]
    # The master's probe was reached over eth0 by the other host.
    assert data["hosts"][0]["facts"]["listen"]["peers"] == [lab.hosts["n2"].address]
    assert parity(data)["torch"]["status"] == "pass"


def test_chatty_shell_output_does_not_corrupt_the_probe(lab, tmp_path):
    import subprocess

    # n2's shell really does print before every command...
    ssh = ["ssh", "-i", str(lab.client_key), "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "BatchMode=yes",
           f"root@{lab.hosts['n2'].address}", "true"]
    out = subprocess.run(lab.in_client(ssh), capture_output=True, text=True, timeout=30).stdout
    assert "Welcome to n2" in out
    # ...and doctor still reads n2's facts.
    rc, data, _ = doctor_json(lab, tmp_path, lab.profile_yaml(["n2"], python=sys.executable))
    assert rc == 0 and data["hosts"][0]["facts"]["hostname"] == "n2"


def test_torch_mismatch_names_the_odd_host(lab, tmp_path):
    rc, data, _ = doctor_json(lab, tmp_path, lab.profile_yaml(["n1", "n2", "n3"], python=sys.executable))
    assert rc == 1 and data["ok"] is False
    torch = parity(data)["torch"]
    assert torch["status"] == "fail"
    assert torch["values"][lab.hosts["n3"].address] == FAKE_TORCH_VERSION
    assert lab.hosts["n3"].address in torch["detail"] and lab.hosts["n1"].address not in torch["detail"]


def test_missing_interface_fails_on_that_host(lab, tmp_path):
    rc, data, _ = doctor_json(lab, tmp_path, lab.profile_yaml(["n1", "n4"], python=sys.executable))
    assert rc == 1
    n1, n4 = data["hosts"]
    assert checks_of(n1)["interface"]["status"] == "pass"
    assert checks_of(n4)["interface"]["status"] == "fail"
    assert "eth0 does not exist" in checks_of(n4)["interface"]["detail"]
    assert "eth1" in checks_of(n4)["interface"]["detail"]


def test_ib_true_without_infiniband_fails(lab, tmp_path):
    text = lab.profile_yaml(["n1"], python=sys.executable).replace("  ib: false\n", "  ib: true\n")
    rc, data, _ = doctor_json(lab, tmp_path, text)
    assert rc == 1
    assert checks_of(data["hosts"][0])["infiniband"]["status"] == "fail"


def test_failures_each_give_their_own_cause_within_the_timeout(lab, tmp_path):
    wrong_key = tmp_path / "wrong_key"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    empty_known = tmp_path / "empty_known_hosts"
    empty_known.write_text("")
    no_torch = tmp_path / "python-without-torch"  # the same interpreter without site-packages
    no_torch.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    no_torch.chmod(0o755)
    cases = {
        "nobody": (lab.profile_yaml(["n1"], python=sys.executable).replace(
            lab.hosts["n1"].address, lab.unused_address()), "reachable", "no "),
        "wrong key": (lab.profile_yaml(["n1"], python=sys.executable, key=wrong_key), "authenticated",
                      "authentication failed"),
        "unknown key": (lab.profile_yaml(["n1"], python=sys.executable, known_hosts=empty_known), "authenticated",
                        "not in"),
        "no python": (lab.profile_yaml(["n1"], python="/nonexistent/python3"), "python", "not found"),
        "no torch": (lab.profile_yaml(["n1"], python=str(no_torch)), "torch", "not installed"),
        "unresolved": (lab.profile_yaml(["n1"], python=sys.executable).replace(
            f"host: {lab.hosts['n1'].address}", "host: no-such-host.invalid"), "reachable", "does not resolve"),
    }
    for label, (text, check, words) in cases.items():
        started = time.monotonic()
        rc, data, err = doctor_json(lab, tmp_path, text, "--timeout", "5")
        elapsed = time.monotonic() - started
        assert rc == 1, (label, data, err)
        host_checks = checks_of(data["hosts"][0])
        assert host_checks[check]["status"] == "fail", (label, host_checks)
        assert words in host_checks[check]["detail"], (label, host_checks[check])
        assert host_checks[check]["hint"], label
        assert elapsed < 3 + 5 + 5, (label, elapsed)  # connect timeout + probe timeout + start-up
        print(f"{label}: {host_checks[check]['detail']} ({elapsed:.2f} s)")


def test_one_bad_host_does_not_stop_the_others(lab, tmp_path):
    text = lab.profile_yaml(["n1", "n2"], python=sys.executable).replace(
        f"host: {lab.hosts['n2'].address}", f"host: {lab.unused_address()}")
    rc, data, _ = doctor_json(lab, tmp_path, text, "--timeout", "8")
    assert rc == 1
    good, bad = data["hosts"]
    assert checks_of(good)["torch"]["status"] == "pass"
    assert checks_of(bad)["reachable"]["status"] == "fail"


def test_human_output_has_the_table_and_hints(lab, tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(lab.profile_yaml(["n1", "n4"], python=sys.executable))
    result = run_in_client(lab, tmp_path, "doctor", "-p", str(path))
    assert result.returncode == 1
    assert "interface" in result.stdout and "FAIL" in result.stdout and "hint:" in result.stdout


def wrapped_python(tmp_path, name: str, body: str):
    """An interpreter path for the profile: a shell wrapper that changes the node's view, then runs ours."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_node_without_iproute2_reads_its_addresses_itself(lab, tmp_path):
    no_ip = wrapped_python(tmp_path, "python-no-tools", f'PATH=/nonexistent exec {sys.executable} "$@"')
    rc, data, err = doctor_json(lab, tmp_path, lab.profile_yaml(["n1", "n2"], python=str(no_ip)))
    assert rc == 0, (data, err)
    for host, name in zip(data["hosts"], ("n1", "n2"), strict=True):
        eth0 = host["facts"]["interfaces"]["eth0"]
        assert eth0["ipv4"] == [f"{lab.hosts[name].address}/24"] and eth0["ipv4_source"] == "ioctl"
        assert host["facts"]["tools"]["ip"] is None
        assert checks_of(host)["interface"]["status"] == "pass"


def python_without(tmp_path, *hidden: str) -> Path:
    """A virtual environment that has every package ours has but ``hidden`` (as after a bare
    `pip install torch`): torchrun's workers, started with its interpreter, lack them too."""
    import subprocess

    import torch

    site = tmp_path / f"site-without-{'-'.join(hidden)}"
    site.mkdir()
    for entry in Path(torch.__file__).parents[1].iterdir():
        if not entry.name.lower().startswith(hidden) and not entry.name.endswith(".pth"):
            (site / entry.name).symlink_to(entry)
    venv = tmp_path / "bare-venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (next(venv.glob("lib/python3*/site-packages")) / "shared.pth").write_text(f"{site}\n")
    return venv / "bin" / "python"


def test_a_node_missing_the_workloads_packages_gets_the_install_command(lab, tmp_path):
    bare = python_without(tmp_path, "numpy", "tokenizers")
    hosts = lab.profile_yaml(["n1", "n2"], python=sys.executable)
    text = lab.profile_yaml(["n2"], python=str(bare))
    rc, data, _ = doctor_json(lab, tmp_path, text)
    assert rc == 1
    check = checks_of(data["hosts"][0])["packages"]
    assert check["status"] == "fail"
    assert check["detail"] == f"numpy: not installed; tokenizers: not installed (for {bare})"
    assert check["hint"] == f"{bare} -m pip install numpy tokenizers"
    assert checks_of(data["hosts"][0])["torch"]["status"] == "pass"  # torch itself is there
    rc, data, _ = doctor_json(lab, tmp_path, hosts)
    assert rc == 0 and parity(data)["numpy"]["status"] == "pass"
    profile = tmp_path / "bare.yaml"
    profile.write_text(text + "train:\n  steps: 2\n")
    launched = run_in_client(lab, tmp_path, "launch", "-p", str(profile))
    assert launched.returncode == 1, launched.stderr
    assert "preflight failed; nothing was started" in launched.stderr
    assert f"{bare} -m pip install numpy tokenizers" in launched.stdout
    assert not list(tmp_path.glob("runs/*/run.json"))  # nothing was started
