"""Fake hosts on one machine: a network namespace per host, a real sshd in each, a client namespace.

Layout (netns mode, needs root and iproute2): a switch namespace holds a bridge; host K's namespace
has ``eth0 = <subnet>.K/24``; the client namespace (``<subnet>.254``) is where tests run fsdpctl,
so nothing ever connects to a test address from the root namespace. Before the subnet exists an
``unreachable`` route for it is added in the root namespace (a stray connect fails here instead
of leaving through the uplink); teardown removes it. Every process is stopped by the PID it wrote,
checked against its command line; nothing is killed by name.

Loopback mode (no CAP_NET_ADMIN): sshd per host on 127.<x>.<y>.K with its own port; same API.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, timeout=30)


_LAB_NUMBERS = itertools.count(1)


def netns_available() -> str | None:
    """None when namespaces with sshd can be built here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "needs iproute2 and util-linux (ip, unshare)"
    if not os.path.exists(SSHD):
        return "needs openssh-server (sshd)"
    probe = f"fsdprobe{os.getpid()}"
    added = _run("ip", "netns", "add", probe, check=False)
    if added.returncode != 0:
        return f"cannot create network namespaces: {added.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def loopback_available() -> str | None:
    """None when sshd can run on loopback here, else the reason it cannot."""
    return None if os.path.exists(SSHD) else "needs openssh-server (sshd)"


@dataclass
class Host:
    """One fake host."""

    name: str
    index: int
    address: str
    port: int
    namespace: str | None
    dir: Path
    pid: int | None = None
    sshd_config: Path | None = None

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"


@dataclass
class Lab:
    """N fake hosts with sshd, a client key, known_hosts, and a client namespace."""

    root: Path
    names: list[str]
    mode: str = "netns"
    hosts: dict[str, Host] = field(default_factory=dict)
    subnet: str = ""
    prefix: int = 24
    """The subnet's length: a /24 up to 250 hosts, a /23, /22 or /21 for more."""
    tag: str = ""
    client_ns: str | None = None
    switch_ns: str | None = None
    _guard: bool = False
    _neighbours: dict[str, int] = field(default_factory=dict)  # ARP table limits raised, as they were
    _created: list[str] = field(default_factory=list)  # the namespaces this lab made (all it removes)

    # ---- lifecycle ----------------------------------------------------------------------------
    def up(self) -> Lab:
        # Unique among the labs of this process (a test module may stand up its own beside the
        # session's): two labs with one tag would share, and tear down, each other's namespaces.
        self.tag = f"f{os.getpid() % 100000}l{next(_LAB_NUMBERS)}"
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "ssh").mkdir(mode=0o700, exist_ok=True)
        try:
            if self.mode == "netns":
                self._network_up()
            else:
                base = f"127.{random.randrange(1, 250)}.{random.randrange(1, 250)}"
                for i, name in enumerate(self.names, start=1):
                    self.hosts[name] = Host(name, i, f"{base}.{i}", 22000 + random.randrange(1000),
                                            None, self.root / name)
            self._keys()
        except BaseException:
            self.down()
            raise
        return self

    def _add_namespace(self, name: str) -> str:
        _run("ip", "netns", "add", name)
        self._created.append(name)
        return name

    def _network_up(self) -> None:
        # Guard first: until teardown, the root namespace answers "unreachable" for the subnet. A
        # subnet whose guard exists already belongs to another lab: take another.
        self._grow_neighbour_table()
        blocks = 1 << max(0, math.ceil(math.log2(max(1, len(self.names)) / PER_24)))  # /24s: 1, 2, 4 or 8
        if blocks > MAX_24S:
            raise ValueError(f"a lab holds up to {MAX_24S * PER_24} hosts")
        self.prefix = 24 - blocks.bit_length() + 1
        for _ in range(50):
            self.subnet = f"10.251.{random.randrange(1, 248 // blocks) * blocks}"  # the block's first /24
            guard = _run("ip", "route", "add", "unreachable", f"{self.subnet}.0/{self.prefix}", check=False)
            if guard.returncode == 0:
                break
        else:
            raise RuntimeError(f"cannot add a guard route in 10.251.0.0/16: {guard.stderr.strip()}")
        self._guard = True
        self.switch_ns = self._add_namespace(f"{self.tag}sw")
        members = [(name, i) for i, name in enumerate(self.names, start=1)] + [("client", 0)]
        bridges = math.ceil(len(members) / PORTS_PER_BRIDGE)  # a bridge takes up to 1,023 ports
        for b in range(bridges):
            _run("ip", "-n", self.switch_ns, "link", "add", f"br{b}", "type", "bridge")
            _run("ip", "-n", self.switch_ns, "link", "set", f"br{b}", "up")
            if b:  # joined to the first one: one Ethernet segment
                _run("ip", "-n", self.switch_ns, "link", "add", f"up{b}", "type", "veth", "peer", "name", f"down{b}")
                for end, bridge in ((f"up{b}", "br0"), (f"down{b}", f"br{b}")):
                    _run("ip", "-n", self.switch_ns, "link", "set", end, "master", bridge)
                    _run("ip", "-n", self.switch_ns, "link", "set", end, "up")
        for n, (name, i) in enumerate(members):
            ns = self._add_namespace(f"{self.tag}{name}")
            _run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{i}",
                 "netns", self.switch_ns)
            _run("ip", "-n", self.switch_ns, "link", "set", f"p{i}", "master", f"br{n // PORTS_PER_BRIDGE}")
            _run("ip", "-n", self.switch_ns, "link", "set", f"p{i}", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/{self.prefix}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            if name == "client":
                self.client_ns = ns
            else:
                self.hosts[name] = Host(name, i, self.address(i), 22, ns, self.root / name)
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts.values())
        for name, _ in members:
            folder = Path("/etc/netns") / f"{self.tag}{name}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(hosts_file)

    def _grow_neighbour_table(self) -> None:
        # The kernel's ARP table is one for all namespaces, 1,024 entries by default: the client's
        # entry for each host, each host's for the client and for the master of its port check, and
        # past that "No route to host" (a 512-host preflight hit it). Raised for a large lab only,
        # and put back on teardown.
        if len(self.names) <= 200:
            return
        for level, per_host in (("gc_thresh1", 2), ("gc_thresh2", 4), ("gc_thresh3", 8)):
            path = Path(f"/proc/sys/net/ipv4/neigh/default/{level}")
            before = int(path.read_text())
            if before < per_host * len(self.names):
                path.write_text(str(per_host * len(self.names)))
                self._neighbours[level] = before

    def address(self, index: int) -> str:
        """The address of the lab's host ``index`` (1-based; 0 is the client, at .254): 250 hosts in
        each /24 of the lab's block, in turn."""
        if index == 0:
            return f"{self.subnet}.254"
        head, _, third = self.subnet.rpartition(".")
        block, last = divmod(index - 1, PER_24)
        return f"{head}.{int(third) + block}.{last + 1}"

    def _keys(self) -> None:
        key = self.root / "ssh" / "id_ed25519"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fsdpctl-test-client", "-f", str(key))
        (self.root / "ssh" / "authorized_keys").write_text((key.with_suffix(".pub")).read_text())
        (self.root / "ssh" / "authorized_keys").chmod(0o600)
        (self.root / "ssh" / "known_hosts").write_text("")

    @property
    def client_key(self) -> Path:
        return self.root / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "ssh" / "known_hosts"

    def start_sshd(self, name: str, extra_config: str = "", overlays: dict[str, Path] | None = None,
                   setup: str = "", openssh_defaults: bool = False, authorized_keys: Path | None = None) -> Host:
        """Start sshd for one host (its own host key; its sessions see hostname ``name``).

        ``overlays`` maps files of this machine to stand-ins that the host's sessions see instead
        (bind mounts in a private mount namespace: nothing changes for anyone else); ``setup`` is
        shell run in that mount namespace before sshd starts (each command ending in ``&&``).
        ``openssh_defaults``: keep OpenSSH's MaxStartups and MaxSessions (the testbed raises them
        elsewhere, so many tests at once never meet them); ``authorized_keys``: another file of keys it
        accepts (default: the lab's client key)."""
        host = self.hosts[name]
        host.dir.mkdir(parents=True, exist_ok=True)
        host_key = host.dir / "ssh_host_ed25519_key"
        if not host_key.exists():
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"host-{name}", "-f", str(host_key))
        config = host.dir / "sshd_config"
        config.write_text(
            f"Port {host.port}\nListenAddress {host.address}\nHostKey {host_key}\nPidFile {host.dir}/sshd.pid\n"
            f"AuthorizedKeysFile {authorized_keys or self.root / 'ssh' / 'authorized_keys'}\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            "UsePAM no\nStrictModes no\nPermitUserEnvironment no\n"
            + ("" if openssh_defaults else "MaxStartups 200\nMaxSessions 50\n") +
            "LogLevel DEBUG1\n" + extra_config)
        Path("/run/sshd").mkdir(exist_ok=True)
        _run(SSHD, "-t", "-f", str(config))
        pid_file = host.dir / "sshd.pid"
        pid_file.unlink(missing_ok=True)
        command = [SSHD, "-f", str(config), "-E", str(host.log)]
        mounts = "".join(f"mount --bind {shlex.quote(str(src))} {shlex.quote(dst)} && "
                         for dst, src in (overlays or {}).items()) + setup
        if host.namespace:
            command = ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "--mount", "sh", "-c",
                       f'hostname "$0" && {mounts}exec "$@"', name, *command]
        elif mounts:
            command = ["unshare", "--mount", "sh", "-c", f'{mounts}exec "$@"', "sshd", *command]
        _run(*command)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text().strip()):
            time.sleep(0.05)
        host.pid = int(pid_file.read_text())
        host.sshd_config = config
        public = " ".join((host_key.with_suffix(".pub")).read_text().split()[:2])
        label = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
        with self.known_hosts.open("a") as handle:
            handle.write(f"{label} {public}\n")
            if host.namespace:
                handle.write(f"{name} {public}\n")
        return host

    def stop_sshd(self, name: str) -> None:
        host = self.hosts[name]
        if host.pid and _is_ours(host.pid, str(host.sshd_config)):
            os.kill(host.pid, signal.SIGTERM)
            _wait_gone(host.pid)
        host.pid = None

    def down(self) -> None:
        # every sshd told at once, then awaited: each takes about 2 s to end (52 s for 26 in turn)
        told = []
        for host in self.hosts.values():
            if host.pid and _is_ours(host.pid, str(host.sshd_config)):
                try:
                    os.kill(host.pid, signal.SIGTERM)
                    told.append(host.pid)
                except ProcessLookupError:
                    pass
            host.pid = None
        for pid in told:
            _wait_gone(pid)
        left = _pids_in_namespaces(self._created)  # one look at every process, not one per namespace
        for ns in reversed(self._created):
            for pid in left.get(ns, ()):
                _kill(pid)
            _run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self._created.clear()
        if self.tag and Path("/etc/netns").is_dir() and not any(Path("/etc/netns").iterdir()):
            Path("/etc/netns").rmdir()
        if self._guard:
            _run("ip", "route", "del", "unreachable", f"{self.subnet}.0/{self.prefix}", check=False)
            self._guard = False
        for level, before in self._neighbours.items():
            Path(f"/proc/sys/net/ipv4/neigh/default/{level}").write_text(str(before))
        self._neighbours.clear()

    # ---- helpers for tests --------------------------------------------------------------------
    def in_client(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the client namespace (or as is in loopback mode)."""
        return ["ip", "netns", "exec", self.client_ns, *argv] if self.client_ns else list(argv)

    def in_host(self, name: str, argv: list[str]) -> list[str]:
        ns = self.hosts[name].namespace
        return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)

    def unused_address(self) -> str:
        """An address in the lab's subnet with no host behind it."""
        return f"{self.subnet}.99" if self.subnet else "127.0.0.1"

    def profile_yaml(self, names: list[str], *, python: str, extra: str = "", interface: str | None = None,
                     key: Path | None = None, known_hosts: Path | None = None, name: str = "lab") -> str:
        """A profile for some of the lab's hosts, keys and known_hosts included."""
        hosts = "".join(f"  - host: {self.hosts[n].address}\n    port: {self.hosts[n].port}\n" for n in names)
        iface = interface or ("eth0" if self.mode == "netns" else "lo")
        return (f"name: {name}\nbackend: ssh\nhosts:\n{hosts}device: cpu\nnproc_per_node: 1\n"
                f"python: {python}\nworkdir: {self.root}/work\nnetwork:\n  interface: {iface}\n  ib: false\n"
                f"ssh:\n  user: root\n  identity_file: {key or self.client_key}\n"
                f"  known_hosts: {known_hosts or self.known_hosts}\n  connect_timeout: 3\n{extra}")


def processes_of(run_id: str, node_rank: int | None = None) -> list[int]:
    """Every process on this machine (all namespaces share its PIDs) that belongs to the run (of its
    node ``node_rank``), found by the environment fsdpctl gives it."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FSDPCTL_RUN_ID={run_id}".encode() in env and (
                node_rank is None or f"FSDPCTL_NODE_RANK={node_rank}".encode() in env):
            found.append(int(proc.name))
    return found


def _is_ours(pid: int, marker: str) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False


def _wait_gone(pid: int, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    _kill(pid)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


PER_24 = 250
"""Hosts in each /24 of a lab's block (.1-.250; the first one's .254 is the client)."""
MAX_24S = 8
"""A lab's largest block, a /21: 2,000 hosts."""
PORTS_PER_BRIDGE = 1000


def _pids_in_namespaces(names: list[str]) -> dict[str, list[int]]:
    """The processes in each of the network namespaces ``names``: what ``ip netns pids`` says, for
    all of them in one pass over /proc (it takes a pass per namespace: a minute for 26 of them)."""
    inodes = {}
    for ns in names:
        try:
            inodes[os.stat(f"/run/netns/{ns}").st_ino] = ns
        except OSError:
            continue
    found: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ns = inodes.get(os.stat(proc / "ns" / "net").st_ino)
        except OSError:
            continue
        if ns is not None:
            found.setdefault(ns, []).append(int(proc.name))
    return found




def named_on_hosts(lab: Lab, program: str) -> dict[int, str]:
    """Every process on the lab's hosts whose command line names ``program``, as ``ps -eo pid,args |
    grep PROGRAM`` on each host finds them (pid -> command line): the hosts' network namespaces only
    (the launcher in the client's is no host's), fsdpctl's node agent aside (a ``python -c`` whose
    arguments carry the run's settings)."""
    hosts = {os.stat(f"/run/netns/{h.namespace}").st_ino for h in lab.hosts.values() if h.namespace}
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.stat(proc / "ns" / "net").st_ino not in hosts:
                continue
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = b" ".join(argv).decode(errors="replace")
        if program in line and argv[1:2] != [b"-c"]:
            found[int(proc.name)] = line
    return found
