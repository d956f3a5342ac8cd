"""The SSH layer against real sshd hosts: host-key policies, ~/.ssh/config, ProxyJump, loopback mode."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import doctor_json, run_in_client
from tests.testbed.lab import Lab, loopback_available

pytestmark = pytest.mark.integration


def checks_of(host: dict) -> dict[str, dict]:
    return {c["name"]: c for c in host["checks"]}


def test_accept_new_records_unknown_keys_then_reuses_them(lab, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    text = lab.profile_yaml(["n1"], python=sys.executable, known_hosts=known).replace(
        "  connect_timeout: 3\n", "  connect_timeout: 3\n  host_key_policy: accept-new\n")
    rc, data, err = doctor_json(lab, tmp_path, text)
    assert rc == 0, (data, err)
    recorded = known.read_text()
    host_key = (lab.hosts["n1"].dir / "ssh_host_ed25519_key.pub").read_text().split()[1]
    assert lab.hosts["n1"].address in recorded and host_key in recorded
    rc, _, _ = doctor_json(lab, tmp_path, text)
    assert rc == 0 and known.read_text() == recorded  # known now: nothing appended twice
    # Hashed as OpenSSH's HashKnownHosts writes it, among 2,000 other hosts' lines: still found, and
    # with the reject policy nothing is appended.
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    others = "".join(f"10.1.{i // 250}.{i % 250 + 1} ssh-ed25519 {host_key}\n" for i in range(2000))
    known.write_text(others + known.read_text())
    hashed = known.read_text()
    assert lab.hosts["n1"].address not in hashed
    rc, data, err = doctor_json(lab, tmp_path, text.replace("host_key_policy: accept-new", "host_key_policy: reject"))
    assert rc == 0 and known.read_text() == hashed, (data, err)


def test_changed_host_key_is_refused_even_with_accept_new(lab, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    known.write_text(f"{lab.hosts['n1'].address} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    for policy in ("reject", "accept-new"):
        text = lab.profile_yaml(["n1"], python=sys.executable, known_hosts=known).replace(
            "  connect_timeout: 3\n", f"  connect_timeout: 3\n  host_key_policy: {policy}\n")
        rc, data, _ = doctor_json(lab, tmp_path, text)
        check = checks_of(data["hosts"][0])["authenticated"]
        assert rc == 1 and check["status"] == "fail", policy
        assert "differs" in check["detail"] and "ssh-keygen -R" in check["hint"], check


def test_ssh_config_alias_and_proxy_jump(lab, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    n1, n2 = lab.hosts["n1"], lab.hosts["n2"]
    (home / ".ssh" / "config").write_text(
        f"Host gpu-a\n  HostName {n1.address}\n  User root\n  IdentityFile {lab.client_key}\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n"
        f"Host gpu-b\n  HostName {n2.address}\n  User root\n  IdentityFile {lab.client_key}\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n  ProxyJump gpu-a\n")
    profile = tmp_path / "alias.yaml"
    profile.write_text(f"name: alias\nbackend: ssh\nhosts: [gpu-a, gpu-b]\ndevice: cpu\nnproc_per_node: 1\n"
                       f"python: {sys.executable}\nnetwork:\n  interface: eth0\nrendezvous:\n  host: gpu-a\n"
                       f"ssh:\n  connect_timeout: 3\n")
    result = run_in_client(lab, tmp_path, "doctor", "-p", str(profile), "--json", "--no-port-check")
    assert result.returncode == 0, (result.stdout, result.stderr)
    # gpu-b was reached through gpu-a: n2's sshd saw the connection come from n1, not the client.
    log = n2.log.read_text()
    assert f"from {n1.address}" in log
    # A jump host that cannot be trusted is named as such.
    (home / ".ssh" / "config").write_text((home / ".ssh" / "config").read_text().replace(
        "ProxyJump gpu-a", f"ProxyJump root@{n1.address}"))
    result = run_in_client(lab, tmp_path, "doctor", "-p", str(profile), "--json", "--no-port-check")
    assert result.returncode == 1 and f"via jump host {n1.address}" in result.stdout


def test_loopback_mode_without_namespaces(tmp_path):
    reason = loopback_available()
    if reason:
        pytest.skip(f"loopback testbed: {reason}")
    lab = Lab(tmp_path / "lab", ["n1", "n2"], mode="loopback").up()
    try:
        for name in lab.names:
            lab.start_sshd(name)
        rc, data, err = doctor_json(lab, tmp_path, lab.profile_yaml(["n1", "n2"], python=sys.executable))
        assert rc == 0, (data, err)
        assert [h["host"] for h in data["hosts"]] == [lab.hosts["n1"].address, lab.hosts["n2"].address]
    finally:
        lab.down()


IDLE_PROGRAM = """\
import sys
from pathlib import Path
from fsdpctl.backends.ssh.transport import IDLE_POLL_SECONDS, SSHTransport
from fsdpctl.profiles.loader import parse_profile
profile = parse_profile(Path(sys.argv[1]).read_text(), sys.argv[1])
node = SSHTransport(profile.hosts[0], profile.ssh)
node.connect()
poll = node.client.get_transport().sock.gettimeout()
status, out, _ = node.run("sleep 1.3; echo late", 30)
node.close()
print(poll == IDLE_POLL_SECONDS, status, out.strip())
"""


def test_a_connection_wakes_once_a_second_when_idle_and_still_runs_commands(lab, tmp_path):
    """paramiko's thread polls every 0.1 s by default (11 % of a core for 256 idle connections);
    once connected it polls every IDLE_POLL_SECONDS, and a command whose output comes between two
    polls still runs to its end."""
    path = tmp_path / "lab.yaml"
    path.write_text(lab.profile_yaml(["n1"], python=sys.executable))
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(lab.in_client([sys.executable, "-c", IDLE_PROGRAM, str(path)]), env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "0", "late"], done.stderr
