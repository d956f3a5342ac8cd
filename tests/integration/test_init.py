"""`fsdpctl init` against hosts that differ as real ones do, on a namespace testbed of its own:

- i1 (the master): eth0, a decoy ``ib0`` (a veth named so, up, with an address) and a ``docker0``
  bridge, and a RoCE port in a fake InfiniBand sysfs tree (its sshd's own mount namespace);
- i2: its card is named ``enp3s0``, and a policy route (``ip rule``) sends traffic to the master from
  a second address;
- i3: two GPUs, as a fake ``nvidia-smi`` on its PATH reports them, and another MTU.

init, then doctor, then a real CPU launch across i1 and i2 with the profile init wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.integration.conftest import require_netns
from tests.testbed.lab import Lab

pytestmark = pytest.mark.integration

FAKE_SMI = "#!/bin/sh\nprintf 'NVIDIA H100 80GB HBM3, 570.86.15, 81559\\nNVIDIA H100 80GB HBM3, 570.86.15, 81559\\n'\n"


def ip(ns: str, *argv: str) -> None:
    subprocess.run(["ip", "-n", ns, *argv], check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def odd_lab(tmp_path_factory):
    require_netns()
    lab = Lab(tmp_path_factory.mktemp("initlab"), ["i1", "i2", "i3"]).up()
    try:
        i1, i2 = lab.hosts["i1"], lab.hosts["i2"]
        ip(i1.namespace, "link", "add", "ib0", "type", "veth", "peer", "name", "ib0peer")
        ip(i1.namespace, "addr", "add", "192.168.77.1/24", "dev", "ib0")
        ip(i1.namespace, "link", "set", "ib0", "up")
        ip(i1.namespace, "link", "set", "ib0peer", "up")
        ip(i1.namespace, "link", "add", "docker0", "type", "bridge")
        ip(i1.namespace, "addr", "add", "172.17.0.1/16", "dev", "docker0")
        ip(i1.namespace, "link", "set", "docker0", "up")
        for argv in (["link", "set", "eth0", "down"], ["link", "set", "eth0", "name", "enp3s0"],
                     ["link", "set", "enp3s0", "up"]):
            ip(i2.namespace, *argv)
        second = f"{lab.subnet}.102"
        ip(i2.namespace, "addr", "add", f"{second}/24", "dev", "enp3s0")
        ip(i2.namespace, "route", "add", f"{i1.address}/32", "dev", "enp3s0", "src", second, "table", "100")
        ip(i2.namespace, "rule", "add", "to", f"{i1.address}/32", "lookup", "100", "priority", "100")
        ib = lab.root / "fake-sysfs"
        port = ib / "infiniband" / "mlx5_0" / "ports" / "1"
        port.mkdir(parents=True)
        for name, text in (("state", "4: ACTIVE\n"), ("link_layer", "Ethernet\n"), ("rate", "100 Gb/sec\n")):
            (port / name).write_text(text)
        (ib / "net").mkdir()
        # sysfs has no infiniband class here: in i1's sshd's own mount namespace, /sys/class becomes a
        # tmpfs holding the real net class (bind-mounted back) and the fake infiniband tree.
        lab.start_sshd("i1", setup=f"mount --bind /sys/class/net {ib}/net && mount -t tmpfs fsdpctl /sys/class && "
                                   f"mkdir /sys/class/net /sys/class/infiniband && mount --bind {ib}/net /sys/class/net"
                                   f" && cp -r {ib}/infiniband/. /sys/class/infiniband/ && ")
        lab.start_sshd("i2")
        fake_bin = lab.root / "fake-bin"
        fake_bin.mkdir()
        (fake_bin / "nvidia-smi").write_text(FAKE_SMI)
        (fake_bin / "nvidia-smi").chmod(0o755)
        ip(lab.hosts["i3"].namespace, "link", "set", "eth0", "mtu", "1400")
        lab.start_sshd("i3", f"SetEnv PATH={fake_bin}:/usr/local/bin:/usr/bin:/bin\n")
        yield lab
    finally:
        lab.down()


def fsdpctl(lab: Lab, tmp_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(tmp_path), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", *args]), env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=tmp_path)


def init(lab: Lab, tmp_path: Path, name: str, *hosts: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return fsdpctl(lab, tmp_path, "init", name, *(lab.hosts[h].address for h in hosts), "--python", sys.executable,
                   "--user", "root", "--identity-file", str(lab.client_key), "--known-hosts", str(lab.known_hosts),
                   "--workdir", f"{lab.root}/work", *extra)


def test_init_then_doctor_then_a_launch_across_hosts_that_differ(odd_lab, tmp_path):
    lab = odd_lab
    i1, i2 = lab.hosts["i1"], lab.hosts["i2"]
    result = init(lab, tmp_path, "odd", "i1", "i2")
    print(f"\n--- fsdpctl init odd i1 i2 ---\n{result.stderr}\n{result.stdout}")
    assert result.returncode == 0, result.stderr[-3000:]
    path = tmp_path / "cluster_profiles" / "odd.yaml"
    text = path.read_text()
    assert text == result.stdout
    data = yaml.safe_load(text)
    assert data["network"] == {"interface": "eth0", "ib": False}
    assert data["hosts"] == [{"host": i1.address, "address": i1.address},
                             {"host": i2.address, "address": f"{lab.subnet}.102", "interface": "enp3s0"}]
    assert data["device"] == "cpu" and data["nproc_per_node"] == 1 and data["python"] == sys.executable
    assert "NCCL alone would pick ib0" in text and "mlx5_0/1 ACTIVE (Ethernet)" in text
    assert "holds the master's address" in text
    assert "kernel route lookup (rtnetlink)" in text
    # this machine has podman (the container tests) and Docker's client on every host: noted, a stub to fill in
    assert "# Container runtimes found: " in text and "podman version 4.3.1 on all 2 hosts" in text, text
    assert "# container:\n#   image: " in text and "#   runtime: podman\n" in text
    err = result.stderr
    assert "interface to the master" in err and "DIFFERS" in err and "enp3s0" in err
    assert "up on " in err and "only: NCCL uses sockets" in err
    again = init(lab, tmp_path, "odd", "i1", "i2")
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr

    doctor = fsdpctl(lab, tmp_path, "doctor", "-p", "odd")
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    launched = fsdpctl(lab, tmp_path, "launch", "-p", "odd", "--preset", "tiny", "--steps", "4", "--batch-size", "4",
                       "--set", "seq_len=64", "--set", "log_interval=2", "--set", "eval_interval=0",
                       "--set", "vocab_size=2000", timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "world=2" in launched.stdout and "step=4 loss=" in launched.stdout
    scripts = sorted((tmp_path / "runs").glob("*/scripts/node1.sh"))
    node1 = scripts[-1].read_text()
    assert "export NCCL_SOCKET_IFNAME==enp3s0" in node1 and "export GLOO_SOCKET_IFNAME=enp3s0" in node1


def test_gpus_are_found_and_hosts_of_two_kinds_are_refused(odd_lab, tmp_path):
    lab = odd_lab
    gpu = init(lab, tmp_path, "gpu", "i3")
    assert gpu.returncode == 0, gpu.stderr[-3000:]
    data = yaml.safe_load(gpu.stdout)
    assert data["device"] == "cuda" and data["nproc_per_node"] == "auto" and data["gpu_memory"] == "81559MiB"
    assert "GPUs: 2 x NVIDIA H100 80GB HBM3 (81559 MiB)" in gpu.stdout
    mixed = init(lab, tmp_path, "mixed", "i1", "i3")
    print(f"\n--- fsdpctl init mixed i1 i3 ---\n{mixed.stderr}")
    assert mixed.returncode == 2, mixed.stderr[-3000:]
    assert f"GPUs on {lab.hosts['i3'].address} but none on {lab.hosts['i1'].address}" in mixed.stderr
    assert "REFUSED" in mixed.stderr and not (tmp_path / "cluster_profiles" / "mixed.yaml").exists()
    mtu_row = next(line for line in mixed.stderr.splitlines() if line.strip("│┃ ").startswith("mtu"))
    assert "1500" in mtu_row and "1400" in mtu_row and "DIFFERS" in mtu_row, mtu_row
    assert "Traceback" not in mixed.stderr
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# DeepSpeed style\n{lab.hosts['i1'].address} slots=2\n{lab.hosts['i2'].address} slots=2\n")
    listed = fsdpctl(lab, tmp_path, "init", "listed", "--hostfile", str(hostfile), "--python", sys.executable,
                     "--user", "root", "--identity-file", str(lab.client_key), "--known-hosts", str(lab.known_hosts))
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert yaml.safe_load(listed.stdout)["nproc_per_node"] == 2
