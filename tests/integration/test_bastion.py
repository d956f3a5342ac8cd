"""Hosts behind a bastion, on a namespace testbed of its own: a bastion whose sshd keeps OpenSSH's
defaults (MaxStartups 10:30:100), 24 hosts the launcher's namespace cannot reach but through it, a
second bastion that refuses the launcher's key, and a host whose sshd drops every connection but one
still being set up (MaxStartups 1:100:1). ``ssh.proxy_jump`` in the profile: doctor reaches every host
every time (several repeats) over one connection to the bastion; a launch of 12 runs through it; a jump
chain is followed; a bastion that refuses the key says so in one line. Without a bastion, a launch
whose connections the crowded sshd drops still reaches every node."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import require_netns
from tests.integration.test_launch import run, run_dir_of
from tests.testbed.lab import Lab

pytestmark = pytest.mark.integration
BEHIND = [f"b{i}" for i in range(1, 25)]
CROWDED = 6


def crowded_addresses(lab: Lab) -> list[str]:
    """The crowded host's own address and five more of its namespace's, past every host of the lab."""
    return [lab.hosts["crowded"].address, *(f"{lab.subnet}.{200 + i}" for i in range(CROWDED - 1))]


@pytest.fixture(scope="module")
def bastion_lab(tmp_path_factory):
    require_netns()
    lab = Lab(tmp_path_factory.mktemp("bastionlab"), ["jump", "refuser", "crowded", *BEHIND]).up()
    try:
        lab.start_sshd("jump", openssh_defaults=True)
        nobody = lab.root / "nobody_keys"
        nobody.write_text("")
        lab.start_sshd("refuser", openssh_defaults=True, authorized_keys=nobody)
        # one sshd that drops every connection past the first still being set up, on several addresses: the
        # nodes of a profile that all reach one sshd at once (as through a login node's) are dropped but one
        crowded = lab.hosts["crowded"]
        for address in crowded_addresses(lab)[1:]:
            subprocess.run(["ip", "-n", crowded.namespace, "addr", "add", f"{address}/{lab.prefix}", "dev", "eth0"],
                           check=True, timeout=30)
        lab.start_sshd("crowded", openssh_defaults=True, extra_config="MaxStartups 1:100:1\n" + "".join(
            f"ListenAddress {address}\n" for address in crowded_addresses(lab)[1:]))
        public = " ".join((crowded.dir / "ssh_host_ed25519_key.pub").read_text().split()[:2])
        with lab.known_hosts.open("a") as handle:
            handle.writelines(f"{address} {public}\n" for address in crowded_addresses(lab))
        for name in BEHIND:
            lab.start_sshd(name)
        for name in BEHIND:  # the launcher's namespace reaches them only through a bastion
            subprocess.run(["ip", "-n", lab.client_ns, "route", "add", "unreachable", f"{lab.hosts[name].address}/32"],
                           check=True, timeout=30)
        yield lab
    finally:
        lab.down()


def profile(lab: Lab, tmp_path: Path, names: list[str], jump: str, name: str = "behind", extra: str = "") -> Path:
    text = lab.profile_yaml(names, python=sys.executable, name=name, extra=extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.replace("ssh:\n", f"ssh:\n  proxy_jump: {jump}\n"))
    return path


def accepted(lab: Lab, name: str) -> int:
    return lab.hosts[name].log.read_text(errors="replace").count("Accepted publickey")


def dropped(lab: Lab, name: str) -> int:
    """Connections the host's sshd dropped past its MaxStartups (OpenSSH logs each one)."""
    return lab.hosts[name].log.read_text(errors="replace").count("past MaxStartups")


def test_doctor_reaches_24_hosts_behind_a_default_bastion_every_time_over_one_connection(bastion_lab, tmp_path):
    lab = bastion_lab
    direct = run(lab, tmp_path, "doctor", "-p", str(profile(lab, tmp_path, ["b1"], "none", name="direct")), "--json")
    assert direct.returncode != 0 and "no route to" in direct.stdout  # no way but the bastion
    path = profile(lab, tmp_path, BEHIND, f"root@{lab.hosts['jump'].address}")
    seconds = []
    for _ in range(3):
        before = accepted(lab, "jump")
        started = time.monotonic()
        result = run(lab, tmp_path, "doctor", "-p", str(path), "--json", timeout=300)
        seconds.append(time.monotonic() - started)
        report = json.loads(result.stdout)
        reached = [h for h in report["hosts"] if h["facts"].get("python")]
        assert len(reached) == 24, [(h["host"], h["status"], h["checks"][:1]) for h in report["hosts"]
                                    if not h["facts"].get("python")]
        assert accepted(lab, "jump") - before == 1  # one connection to the bastion for all 24 hosts
    assert dropped(lab, "jump") == 0
    print(f"\n--- doctor of 24 hosts behind one default bastion: {[round(s, 1) for s in seconds]} s; "
          f"1 bastion connection each; {dropped(lab, 'jump')} dropped ---")


PROGRAM = "import os, socket\nprint(f'behind host={socket.gethostname()} rank={os.environ[\"RANK\"]}', flush=True)\n"


def test_a_launch_of_12_hosts_behind_the_bastion(bastion_lab, tmp_path):
    """Twelve, past the bastion's MaxStartups start of 10, all over its one connection (24 torchruns
    cost the suite a minute of both cores for the same proof; doctor above reaches all 24). The
    rendezvous gives up well before the test does, so a stuck one ends with the launcher's own account."""
    lab = bastion_lab
    code = tmp_path / "code"
    code.mkdir()
    (code / "behind.py").write_text(PROGRAM)
    hosts = BEHIND[:12]
    path = profile(lab, tmp_path, hosts, f"root@{lab.hosts['jump'].address}", name="all",
                   extra="rendezvous:\n  timeout: 240\n")
    before, started = accepted(lab, "jump"), time.monotonic()
    launched = run(lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--", "behind.py", timeout=480)
    took = time.monotonic() - started
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    said = sorted(line.split("behind host=")[1].split()[0] for line in launched.stdout.splitlines()
                  if "behind host=" in line)
    assert said == sorted(hosts), said
    assert accepted(lab, "jump") - before == 1 and dropped(lab, "jump") == 0
    print(f"\n--- launch of 12 hosts behind one default bastion: {took:.1f} s, 1 bastion connection, "
          f"{dropped(lab, 'jump')} dropped ---")


def test_a_launch_whose_connections_an_sshd_drops_past_maxstartups_still_reaches_every_node(bastion_lab, tmp_path):
    """Six nodes on one sshd (its addresses) that drops every connection but one while they are set up:
    each dropped one is tried again, at paced and spread-out moments, and every node runs."""
    lab = bastion_lab
    crowded = lab.hosts["crowded"]
    code = tmp_path / "code"
    code.mkdir()
    (code / "behind.py").write_text(PROGRAM)
    text = lab.profile_yaml(["crowded"], python=sys.executable, name="crowded")
    hosts = "".join(f"  - host: {address}\n    port: 22\n" for address in crowded_addresses(lab))
    path = tmp_path / "crowded.yaml"
    path.write_text(text.replace(f"  - host: {crowded.address}\n    port: {crowded.port}\n", hosts))
    before = dropped(lab, "crowded")
    launched = run(lab, tmp_path, "launch", "-p", str(path), "--no-preflight", "--code", str(code), "--", "behind.py",
                   timeout=300)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    ranks = sorted(int(line.split("rank=")[1]) for line in launched.stdout.splitlines() if "behind host=" in line)
    assert ranks == list(range(CROWDED)), launched.stdout[-3000:]
    assert dropped(lab, "crowded") - before >= 1  # the sshd did drop some: they were tried again
    assert "Traceback" not in launched.stdout + launched.stderr  # paramiko's own log of each drop stays out
    timeline = json.loads((run_dir_of(tmp_path) / "run.json").read_text())["timeline"]["phases"]
    assert 1 <= len(timeline["dropped"]) < CROWDED, timeline  # the nodes tried again, in the run's timeline
    timings = run(lab, tmp_path, "status", "--timings", run_dir_of(tmp_path).name).stdout
    assert "dropped by its sshd or its handshake timed out, tried again" in timings, timings
    print(f"\n--- 6 nodes on one sshd with MaxStartups 1:100:1: {dropped(lab, 'crowded') - before} connections "
          f"dropped and tried again ---")


def test_a_launch_through_the_bastion_and_a_chain_of_two(bastion_lab, tmp_path):
    lab = bastion_lab
    jump = lab.hosts["jump"].address
    path = profile(lab, tmp_path, ["b1", "b2"], f"root@{jump}",
                   extra="train:\n  preset: tiny\n  steps: 4\n  batch_size: 4\n  seq_len: 64\n  vocab_size: 2000\n"
                         "  eval_interval: 0\n")
    launched = run(lab, tmp_path, "launch", "-p", str(path), timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "step=4 loss=" in launched.stdout
    # a chain: the bastion, then b1, then b3 (b1 reaches b3 as the bastion does)
    through_b1 = accepted(lab, "b1")
    chained = run(lab, tmp_path, "doctor", "-p", str(profile(lab, tmp_path, ["b3"], f"{jump},{lab.hosts['b1'].address}",
                                                             name="chain")), "--json")
    report = json.loads(chained.stdout)
    assert report["hosts"][0]["facts"].get("python"), report["hosts"][0]
    assert accepted(lab, "b1") == through_b1 + 1  # the second hop was b1 itself


def test_a_bastion_that_refuses_the_key_says_so_in_one_line(bastion_lab, tmp_path):
    lab = bastion_lab
    refuser = lab.hosts["refuser"].address
    result = run(lab, tmp_path, "doctor", "-p", str(profile(lab, tmp_path, ["b1", "b2"], f"root@{refuser}",
                                                            name="refused")))
    assert result.returncode != 0
    said = [line for line in result.stdout.splitlines() if line.startswith("FAIL ") and "via jump host" in line]
    assert said and all(f"via jump host {refuser}: authentication failed as root" in line for line in said), \
        result.stdout[-2000:]
    assert "RecursionError" not in result.stdout + result.stderr
