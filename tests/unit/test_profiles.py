"""Profile loading: shipped profiles, search order, and one precise line for every bad input."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fsdpctl.errors import ProfileError, ProfileNotFound
from fsdpctl.profiles.loader import find_profile, list_profiles, load_profile, parse_profile
from fsdpctl.profiles.schema import ClusterProfile
from fsdpctl.resources import shipped_dir

SHIPPED = sorted(shipped_dir("cluster_profiles").glob("*.yaml"))

GOOD = """\
name: lab
backend: ssh
hosts:
  - n1
  - host: n2
    address: 10.1.0.2
    port: 2222
network:
  interface: eth0
  ib: false
"""


def test_every_shipped_profile_loads():
    names = {p.stem for p in SHIPPED}
    assert {"local", "two-node", "slurm"} <= names
    for path in SHIPPED:
        profile = load_profile(str(path)).profile
        assert isinstance(profile, ClusterProfile)
        assert profile.name == path.stem


def test_two_node_profile_is_two_ssh_hosts_without_ib():
    profile = load_profile("two-node").profile
    assert profile.backend == "ssh" and len(profile.hosts) == 2
    assert profile.network.interface and profile.network.ib is False


def test_good_profile_reads_scalar_and_mapping_hosts():
    profile = parse_profile(GOOD, "lab.yaml")
    assert [h.host for h in profile.hosts] == ["n1", "n2"]
    assert profile.hosts[1].address == "10.1.0.2" and profile.hosts[1].port == 2222


def error_of(text: str) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        parse_profile(textwrap.dedent(text), "lab.yaml")
    message = str(info.value)
    assert "\n" not in message, message
    return info.value


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        (GOOD + "network2: {}\n", 11, "network2", "did you mean 'network'"),
        (GOOD.replace("interface:", "ifname:"), 9, "network.ifname", "did you mean 'interface'"),
        (GOOD + "rendezvous:\n  port: abc\n", 12, "rendezvous.port", "not an integer"),
        (GOOD + "rendezvous:\n  port: 70000\n", 12, "rendezvous.port", "not a TCP port"),
        ('name: x\nbackend: ssh\nhosts: ["a;rm -rf /"]\n', 3, "hosts[0].host", "not a host name"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nenv:\n  'A B': x\n", 5, "env.A B", "environment variable"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nenv:\n  NCCL_SOCKET_IFNAME: eth1\n", 5,
         "env.NCCL_SOCKET_IFNAME", "network section"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nenv:\n  FLAG: yes\n", 5, "env.FLAG", "quote it"),
        ("name: x\nbackend: ssh\nhosts: [n1]\ntrain:\n  fsdp: 3\n", 5, "train.fsdp", "not allowed"),
        ("name: x\nbackend: ssh\nhosts: [n1]\ntrain:\n  batchsize: 3\n", 5, "train.batchsize", "batch_size"),
        ("name: x\nbackend: ssh\nhosts: [n1]\ntrain:\n  steps: 5\n  epochs: 2\n", 5, "train.steps", "only one"),
        ("name: x\nbackend: ssh\n", 1, "hosts", "at least one host"),
        ("name: x\nname: y\n", 2, "name", "given twice"),
        ("name: x\n  bad: [\n", 2, "(yaml)", "not allowed"),
        ("- a\n", 1, "(top level)", "mapping"),
        ("name: x\nbackend: cloud\n", 2, "backend", "not a backend fsdpctl knows"),
        ("name: x\nbackend: slurm\n", 1, "slurm", "slurm section"),
        ("name: 'has space'\nbackend: local\n", 1, "name", "run id"),
        ("name: x\nbackend: local\ndevice: cpu\n", 1, "nproc_per_node", "device is cpu"),
        ("name: x\nbackend: slurm\nslurm:\n  time: soon\n", 4, "slurm.time", "Slurm time"),
        ("name: x\nbackend: slurm\nslurm:\n  directives: ['--mem=$(reboot)']\n", 4, "slurm.directives[0]",
         "sbatch option"),
        ("name: x\nbackend: ssh\nhosts: [n1, n1]\n", 3, "hosts", "twice"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nrendezvous:\n  host: n9\n", 5, "rendezvous.host", "not one of hosts"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nworkdir: '/tmp/a b'\n", 4, "workdir", "no spaces"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nnetwork:\n  ib_hca: mlx5_0\n", 5, "network.ib_hca", "ib is false"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nssh:\n  host_key_policy: off\n", 5, "ssh.host_key_policy",
         "not one of"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nnproc_per_node: two\n", 4, "nproc_per_node", "integer or 'auto'"),
        ("name: x\nbackend: ssh\nhosts: n1\n", 3, "hosts", "expected a list"),
        ("name: x\nbackend: ssh\nhosts: [n1]\n---\nname: y\n", 5, "(top level)", "more than one"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nhang_timeout: 2\n", 4, "hang_timeout", "outside 5-604800"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nmax_restarts: -1\n", 4, "max_restarts", "outside 0-100"),
        ("name: x\nbackend: ssh\nhosts: [n1]\non_hang: wait\n", 4, "on_hang", "not stop or keep"),
        ("name: x\nbackend: ssh\nhosts: [n1]\nnode_timeout: 1\n", 4, "node_timeout", "outside 3-86400"),
    ],
)
def test_bad_profile_gives_one_precise_line(text, line, field, words):
    exc = error_of(text)
    assert exc.line == line, str(exc)
    assert exc.field == field, str(exc)
    assert words in str(exc), str(exc)
    assert str(exc).startswith(f"lab.yaml:{line}: {field}: ")


def test_yaml_sexagesimal_time_stays_the_text_written():
    profile = parse_profile("name: x\nbackend: slurm\nslurm:\n  time: 1:30:00\n", "s.yaml")
    assert profile.slurm is not None and profile.slurm.time == "1:30:00"


def test_empty_file_and_non_utf8(tmp_path):
    with pytest.raises(ProfileError, match="empty"):
        parse_profile("", "e.yaml")
    bad = tmp_path / "bin.yaml"
    bad.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ProfileError, match="not UTF-8"):
        load_profile(str(bad))


def write(path: Path, name: str, backend: str = "local") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{name}.yaml"
    target.write_text(f"name: {name}\nbackend: {backend}\nnproc_per_node: 1\n")
    return target


def test_search_order_project_then_user_then_shipped(tmp_path, isolated_home):
    project = tmp_path / "proj"
    user_dir = isolated_home / ".config" / "fsdpctl" / "profiles"
    write(user_dir, "local")
    write(user_dir, "mine")
    env = {"HOME": str(isolated_home), "XDG_CONFIG_HOME": str(isolated_home / ".config")}
    project.mkdir()
    # user beats shipped
    assert find_profile("local", cwd=project, env=env) == user_dir / "local.yaml"
    write(project / "cluster_profiles", "local")
    # project beats user
    assert find_profile("local", cwd=project, env=env) == project / "cluster_profiles" / "local.yaml"
    # shipped is last
    assert find_profile("slurm", cwd=project, env=env) == shipped_dir("cluster_profiles") / "slurm.yaml"
    entries = list_profiles(cwd=project, env=env)
    locals_ = [e for e in entries if e.name == "local"]
    assert [e.origin for e in locals_] == ["project", "user", "shipped"]
    assert [e.shadowed for e in locals_] == [False, True, True]


def test_unknown_profile_name_suggests_a_close_one(tmp_path, isolated_home):
    with pytest.raises(ProfileNotFound, match="no such profile") as info:
        find_profile("two-nodes", cwd=tmp_path)
    assert "two-node" in (info.value.hint or "")


def test_path_value_reads_that_file(tmp_path):
    target = write(tmp_path, "direct")
    assert load_profile(str(target)).profile.name == "direct"
    with pytest.raises(ProfileNotFound, match="no such profile file"):
        load_profile(str(tmp_path / "missing.yaml"))
