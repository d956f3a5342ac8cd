"""`fsdpctl init` without hosts: hostfiles and Slurm node lists, the decisions made from the hosts'
findings (and the refusals), the written profile read back by the loader, and finding a Python with
torch where the login shell's has none."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from fsdpctl.errors import UsageError
from fsdpctl.hostcheck.findings import HostFinding, decide
from fsdpctl.profiles.hostlist import expand_nodelist, parse_hostfile


def test_hostfiles_as_deepspeed_and_mpi_write_them():
    hosts = parse_hostfile("# the lab\nworker-1 slots=8\nworker-2:4  # MPICH\n\n10.0.0.3\n", "hosts")
    assert [(h.host, h.slots) for h in hosts] == [("worker-1", 8), ("worker-2", 4), ("10.0.0.3", None)]
    for text, words in (("w1 slots=x\n", "not a slots=N field"), ("w1:x\n", "not a count"), ("w1\nw1\n", "twice"),
                        ("w1 slots=0\n", "0 slots"), ("# nothing\n", "no hosts"), ("w$1\n", "not a host name"),
                        ("[::1]:4\n", "not a host name"), ("-w1\n", "not a host name")):
        with pytest.raises(UsageError, match=words) as error:
            parse_hostfile(text, "hosts")
        assert error.value.message.startswith("hosts"), error.value.message


def test_open_mpis_max_slots_is_a_cap_not_the_count_and_ipv6_hosts_are_bare():
    hosts = parse_hostfile("a slots=4 max_slots=8\nb max-slots=2\nfe80::1 slots=2\n", "hosts")
    assert [(h.host, h.slots) for h in hosts] == [("a", 4), ("b", None), ("fe80::1", 2)]


def test_init_refuses_a_master_that_resolves_to_loopback_here():
    """Debian maps a machine's own name to 127.0.1.1: written as the master's address, every other
    host would try to reach itself. Refused before any host is contacted."""
    from fsdpctl.api.init import init_profile

    with pytest.raises(UsageError, match="loopback address the other hosts cannot reach"):
        init_profile("x", ["localhost", "10.0.0.2"], write=False)
    with pytest.raises(UsageError, match="--master with --slurm"):
        init_profile("x", slurm=True, nodelist="n[1-2]", master="n1", write=False)


def test_slurm_nodelists_expand_as_scontrol_does():
    assert expand_nodelist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_nodelist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_nodelist("n[8-10]") == ["n8", "n9", "n10"]
    for bad in ("n[1-", "n[3-1]", "n[a]", "", "n1 n2"):
        with pytest.raises(UsageError, match="--nodelist"):
            expand_nodelist(bad)


def host(name: str, **changes) -> HostFinding:
    values = {"host": name, "node_rank": 0, "hostname": name, "interface": "eth0", "source": f"10.0.0.{name[-1]}",
              "route": "kernel route lookup (rtnetlink)", "cidr": f"10.0.0.{name[-1]}/24", "mtu": 1500,
              "nccl_default": "eth0", "python": "/opt/venv/bin/python", "python_version": "3.11.7",
              "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.5", "gpu_count": 8, "gpu_names": ("NVIDIA H100",),
              "gpu_memory_mib": 81559}
    values.update(changes)
    return HostFinding(**values)


def test_hosts_that_agree_make_one_profile():
    hosts = [host("h1"), host("h2", ib_ports=(("mlx5_0", "1", "4: ACTIVE", "InfiniBand"),)),
             host("h3", interface="enp3s0", mtu=9000, nccl_default="ib0")]
    decision = decide(hosts, hosts[0], "auto", None)
    assert not decision.refusals
    assert decision.interface == "eth0" and decision.host_interfaces == {"h3": "enp3s0"}
    assert decision.device == "cuda" and decision.nproc_per_node == "auto" and decision.gpu_memory_mib == 81559
    assert not decision.ib  # one host only has a port up
    text = "\n".join(decision.warnings)
    assert "MTU differs" in text and "h3: NCCL alone would pick ib0" in text and "up on h2 only" in text
    rows = {row.fact: row.status for row in decision.rows}
    assert rows["mtu"] == "differs" and rows["torch"] == "ok" and rows["interface to the master"] == "differs"


@pytest.mark.parametrize(("changes", "ib", "words"), [
    ({"gpu_count": 0, "gpu_names": ()}, "auto", "GPUs on h1 but none on h2"),
    ({"python": "/usr/bin/python3"}, "auto", "python: h1 /opt/venv/bin/python, h2 /usr/bin/python3"),
    ({}, "on", "--ib on: no InfiniBand/RoCE port is up on h1, h2"),
    ({"error": "reachable: connection refused"}, "auto", "h2: reachable: connection refused"),
])
def test_what_cannot_be_one_profile_value_is_refused_with_the_hosts_named(changes, ib, words):
    hosts = [host("h1"), host("h2", **changes)]
    assert words in "\n".join(decide(hosts, hosts[0], ib, None).refusals)


def test_differing_versions_are_written_with_a_warning_doctor_will_fail():
    hosts = [host("h1"), host("h2", torch="2.12.0")]
    decision = decide(hosts, hosts[0], "auto", None)
    assert not decision.refusals and any("torch differs" in w for w in decision.warnings)
    assert {row.fact: row.status for row in decision.rows}["torch"] == "fails"


def test_the_written_profile_reads_back(tmp_path):
    from fsdpctl.api.init import profile_text
    from fsdpctl.profiles.loader import parse_profile
    from fsdpctl.profiles.schema import ClusterProfile, HostSpec, SSHSpec

    hosts = [host("h1"), host("h2", interface="enp3s0", plugins=("/usr/lib/libnccl-net.so",))]
    hosts[1] = HostFinding(**{**hosts[1].__dict__, "node_rank": 1})
    decision = decide(hosts, hosts[0], "auto", None)
    probed = ClusterProfile(name="lab", hosts=(HostSpec(host="h1"), HostSpec(host="h2")),
                            ssh=SSHSpec(user="me", identity_file="~/.ssh/lab key"))
    text = profile_text("lab", hosts, decision, probed, hosts[0], {}, False, None, "auto")
    profile = parse_profile(text, "lab.yaml")
    assert profile.network.interface == "eth0" and not profile.network.ib
    assert [(h.host, h.address, h.interface) for h in profile.hosts] == [("h1", "10.0.0.1", None),
                                                                          ("h2", "10.0.0.2", "enp3s0")]
    assert profile.device == "cuda" and profile.gpu_memory == "81559MiB"
    assert profile.ssh.identity_file == "~/.ssh/lab key"
    assert "# Written by `fsdpctl init lab`" in text and "h2: enp3s0 10.0.0.2/24 mtu 1500" in text
    assert "NCCL net plugins: libnccl-net.so" in text and "NCCL_NET=Socket" in text


def test_a_python_with_torch_is_found_when_the_login_shells_has_none(tmp_path, monkeypatch):
    """The node-side search, run here: HOME holds a venv whose python is this one (it has torch)."""
    from fsdpctl.hostcheck.probe import probe_source

    venv = tmp_path / "venv" / "bin"  # this venv, seen from another folder (its pyvenv.cfg makes it a venv)
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(Path(sys.executable).resolve())
    (venv.parent / "pyvenv.cfg").write_text((Path(sys.prefix) / "pyvenv.cfg").read_text())
    (venv.parent / "lib").symlink_to(Path(sys.prefix) / "lib", target_is_directory=True)
    namespace: dict = {}
    exec(compile(probe_source(), "probe", "exec"), namespace)  # noqa: S102 - the probe as the node runs it
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no python3 on this PATH
    found = namespace["python_with_torch"](probe_source(), "/usr/bin/python3")
    assert [entry["path"] for entry in found] == [str(venv / "python")]
    assert found[0]["torch"]["installed"] and found[0]["torch"]["version"].startswith("2.")
    assert json.loads(json.dumps(found))  # what the probe sends back is JSON
    assert os.path.exists(found[0]["path"])
    assert Path(found[0]["path"]).resolve() == Path(sys.executable).resolve()
    assert os.environ["HOME"] == str(tmp_path)


def test_the_interface_nccl_would_pick_follows_nccls_own_order(monkeypatch):
    from fsdpctl.hostcheck import discover_script

    def pick(*names: str, down: tuple[str, ...] = ()) -> str | None:
        monkeypatch.setattr(discover_script.socket, "if_nameindex", lambda: list(enumerate(names, start=1)))
        return discover_script.nccl_default({n: {"up": n not in down, "ipv4": ["10.0.0.1/24"]} for n in names})

    assert pick("lo", "docker0", "virbr0", "eth0") == "eth0"
    assert pick("lo", "virbr0", "eth0", "ib0") == "ib0"  # IPoIB first, wherever it is
    assert pick("lo", "eth0", "ib0", down=("ib0",)) == "eth0"
    assert pick("lo", "virbr0", "docker0") == "docker0" and pick("virbr0", "lo") == "lo"
    assert pick("virbr0") == "virbr0" and pick() is None
