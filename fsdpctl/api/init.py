"""``init_profile``: a cluster profile written from the hosts themselves. Every host is probed as
doctor probes it (over SSH, or through ``srun`` on a Slurm allocation), and also asked which card
routes to the master, what NCCL would pick on its own, its InfiniBand/RoCE ports and NCCL plugins,
its GPUs, and which Python has torch; where the hosts disagree is shown, what cannot be one profile
value is refused with the hosts named, and the rest is written with a comment per host."""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from ..errors import UsageError
from ..hostcheck.findings import Decision, HostFinding, IbMode, Row, decide, finding_of
from .events import Emitter, EventHandler
from .options import PathLike

if TYPE_CHECKING:
    from ..hostcheck.checks import DoctorReport
    from ..profiles.schema import ClusterProfile



@dataclass(frozen=True)
class InitResult:
    """What init found and wrote."""

    name: str
    text: str
    """The profile, as written."""
    path: Optional[Path]
    """Where it was written (None: not written)."""
    findings: tuple[HostFinding, ...]
    rows: tuple[Row, ...]
    """Each fact across the hosts, and whether they agree."""
    warnings: tuple[str, ...]
    seconds: float


class InitRefused(UsageError):
    """No one profile can describe these hosts: ``refusals`` say why, naming them; ``findings`` and
    ``rows`` say what was found."""

    def __init__(self, refusals: list[str], findings: list[HostFinding], rows: list[Row]):
        more = f" (and {len(refusals) - 1} more, above)" if len(refusals) > 1 else ""
        super().__init__(f"no profile written: {refusals[0]}{more}",
                         "fix the hosts named, or profile the hosts of one kind together")
        self.refusals, self.findings, self.rows = refusals, findings, rows


def init_profile(name: str, hosts: Sequence[str] = (), *, hostfile: Optional[PathLike] = None, slurm: bool = False,
                 nodelist: Optional[str] = None, partition: Optional[str] = None, master: Optional[str] = None,
                 python: Optional[str] = None, ib: IbMode = "auto", user: Optional[str] = None,
                 port: Optional[int] = None, identity_file: Optional[str] = None, known_hosts: Optional[str] = None,
                 workdir: Optional[str] = None, output: Optional[PathLike] = None, force: bool = False,
                 write: bool = True,
                 timeout: float = 20.0, concurrency: int = 1024,
                 on_event: Optional[EventHandler] = None) -> InitResult:
    """Probe ``hosts`` (names, addresses or ``~/.ssh/config`` aliases), a DeepSpeed/MPI ``hostfile``,
    or with ``slurm`` the nodes of ``nodelist`` (default: this allocation's) through ``srun``, and
    write profile ``name`` to ``output`` (default ``./cluster_profiles/NAME.yaml``; an existing file
    only with ``force``). ``master``: the rendezvous host (default: the first). ``python``: the
    interpreter with torch on the nodes (default: found on each). ``ib``: auto (InfiniBand when every
    host has a port up), on, or off. ``workdir``: where runs go on the nodes (default ``~/fsdpctl``;
    for Slurm, storage every node shares). Raises InitRefused when no one profile fits the hosts."""
    from ..profiles.schema import NAME_PATTERN

    started = time.monotonic()
    if not NAME_PATTERN.match(name):
        raise UsageError(f"init {name!r}: not a profile name", "use letters, digits, '.', '_' and '-'")
    if ib not in ("auto", "on", "off"):
        raise UsageError(f"--ib {ib!r}: not auto, on or off", "give --ib auto, --ib on or --ib off")
    path = Path(output).expanduser() if output is not None else Path("cluster_profiles") / f"{name}.yaml"
    if write and path.exists() and not force:
        raise UsageError(f"{path}: exists", "choose another name or -o PATH, or overwrite it with --force")
    emit = Emitter(on_event)
    if slurm:
        if hosts or hostfile:
            raise UsageError("--slurm: the nodes come from the allocation", "drop the hosts (or --hostfile)")
        if master:
            raise UsageError("--master with --slurm: the head node is the job's first node, whichever it is",
                             "drop --master")
        profile, listed, slots = _slurm_profile(name, nodelist, partition, python), [], {}
        master_addr = "FSDPCTL_HEAD_ADDRESS"  # the node itself reads the head node's address from Slurm
    else:
        listed, slots = _host_list(hosts, hostfile)
        profile = _ssh_profile(name, listed, python, user, port, identity_file, known_hosts)
        master = master or listed[0]
        if master not in listed:
            raise UsageError(f"--master {master}: not one of the hosts", "name one of them, e.g. " + listed[0])
        master_addr = _address_of(profile, master)
        if len(listed) > 1 and _is_loopback(master_addr):
            raise UsageError(f"{master}: resolves to {master_addr} on this machine, a loopback address the other "
                             "hosts cannot reach (Debian and Ubuntu map a machine's own name to 127.0.1.1)",
                             f"name {master} by an address the hosts share (e.g. its eth0 address), "
                             "or map its name to that address in /etc/hosts")
    report = _probe(profile, master_addr, slurm, timeout, concurrency, emit)
    names = listed or [h.host for h in report.hosts]
    findings = [finding_of(names[h.node_rank] if listed else h.host, h.node_rank, h.facts, _why(h))
                for h in report.hosts]
    master_finding = next((f for f in findings if f.host == master), findings[0]) if findings else None
    if master_finding is None:
        raise InitRefused(["no host answered: " + "; ".join(c.detail for c in report.cluster if c.status == "fail")],
                          [], [])
    decision = decide(findings, master_finding, ib, python)
    refusals = list(decision.refusals)
    if slurm and decision.host_interfaces:
        # A Slurm profile names no hosts, so it has no per-host interface to give.
        named = ", ".join(f"{host}: {name}" for host, name in sorted(decision.host_interfaces.items()))
        refusals.append(f"the nodes route to the head node through differently named cards ({named}), and a "
                        "Slurm profile holds one network.interface; rename them alike, or profile them over SSH")
    if refusals:
        raise InitRefused(refusals, findings, decision.rows)
    text = profile_text(name, findings, decision, profile, master_finding, slots, slurm, partition, ib, workdir)
    _check(text, path)
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return InitResult(name, text, path if write else None, tuple(findings), tuple(decision.rows),
                      tuple(decision.warnings), time.monotonic() - started)


def _host_list(hosts: Sequence[str], hostfile: Optional[PathLike]) -> tuple[list[str], dict[str, int]]:
    from ..profiles.hostlist import read_hostfile

    listed = [h for h in hosts]
    slots: dict[str, int] = {}
    if hostfile is not None:
        for entry in read_hostfile(Path(hostfile)):
            if entry.host not in listed:
                listed.append(entry.host)
            if entry.slots is not None:
                slots[entry.host] = entry.slots
    if not listed:
        raise UsageError("init: no hosts", "name them (fsdpctl init NAME host1 host2), give --hostfile, or --slurm")
    if len(set(listed)) != len(listed):
        raise UsageError("init: a host is named twice", "name each host once")
    return listed, slots


def _ssh_profile(name: str, hosts: list[str], python: Optional[str], user: Optional[str], port: Optional[int],
                 identity_file: Optional[str], known_hosts: Optional[str]) -> ClusterProfile:
    from ..profiles.schema import ClusterProfile, HostSpec, SSHSpec

    return ClusterProfile(name=name, backend="ssh", hosts=tuple(HostSpec(host=h) for h in hosts), python=python,
                          ssh=SSHSpec(user=user, port=port, identity_file=identity_file, known_hosts=known_hosts))


def _slurm_profile(name: str, nodelist: Optional[str], partition: Optional[str],
                   python: Optional[str]) -> ClusterProfile:
    from ..profiles.hostlist import expand_nodelist
    from ..profiles.schema import ClusterProfile, SlurmSpec

    nodelist = nodelist or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise UsageError("--slurm: which nodes?", "give --nodelist (e.g. gpu[01-04]), or run inside an allocation")
    nodes = expand_nodelist(nodelist)
    return ClusterProfile(name=name, backend="slurm", python=python,
                          slurm=SlurmSpec(nodes=len(nodes), partition=partition,
                                          directives=(f"--nodelist={','.join(nodes)}",)))


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a name left for the nodes to resolve
        return False


def _address_of(profile: ClusterProfile, host: str) -> str:
    """The master's address as this machine resolves it, through the profile's backend."""
    from ..backends import backend_for

    backend = backend_for(profile)
    try:
        return backend.address_of(host)
    finally:
        backend.close()


def _probe(profile: ClusterProfile, master_addr: str, slurm: bool, timeout: float, concurrency: int,
           emit: Emitter) -> DoctorReport:
    from ..backends import backend_for
    from ..backends.base import DoctorRequest
    from ..hostcheck.probe import packed_probe_source

    request = DoctorRequest(port=0, port_check=False, timeout=timeout, concurrency=concurrency,
                            extra={"init": {"master": master_addr, "probe_packed": packed_probe_source()}})
    backend = backend_for(profile)
    try:
        return backend.doctor(request, on_host=lambda host: emit.notice(
            f"  {host.host}: probed ({host.seconds:.2f} s)" if host.facts is not None else
            f"  {host.host}: FAILED: {_why(host)}", "info" if host.facts is not None else "error"))
    finally:
        backend.close()


def _why(host: Any) -> Optional[str]:
    failed = [c for c in host.checks if c.status == "fail"]
    return f"{failed[0].name}: {failed[0].detail}" if failed and host.facts is None else None


def _check(text: str, path: Path) -> None:
    """The written profile must read back as a profile (anything else is fsdpctl's bug, said so)."""
    from ..errors import ProfileError
    from ..profiles.loader import parse_profile

    try:
        parse_profile(text, str(path))
    except ProfileError as exc:
        raise AssertionError(f"init wrote a profile its own loader refuses: {exc.message}\n{text}") from None


def container_stub(findings: list[HostFinding], slurm: bool) -> list[str]:
    """Comment lines: the container runtimes the hosts have, and a ``container:`` section to fill in."""
    probed = [f for f in findings if not f.error]
    hosts: dict[str, list[str]] = {}
    versions: dict[str, set[str]] = {}
    for finding in probed:
        for name, version in finding.runtimes:
            hosts.setdefault(name, []).append(finding.host)
            versions.setdefault(name, set()).add(version.split(",")[0] or name)
    if not hosts:
        return ["No container runtime on the hosts (docker, podman, apptainer, enroot): the ranks run in `python`."]
    found = [f"{'/'.join(sorted(versions[name]))} on "
             f"{'all ' + str(len(on)) + ' hosts' if len(on) == len(probed) else ', '.join(on)}"
             for name, on in sorted(hosts.items())]
    everywhere = [name for name, on in hosts.items() if len(on) == len(probed)]
    runtime = "pyxis" if slurm and "enroot" in hosts else next(
        (name for name in ("podman", "docker", "apptainer") if name in everywhere), "docker")
    return [f"Container runtimes found: {'; '.join(found)}.",
            "To run the ranks inside an image on every node (python: is then the image's Python):",
            "container:", '  image: "nvcr.io/nvidia/pytorch:25.01-py3"', f"  runtime: {runtime}",
            "  pull: missing  # always: pull before every launch; never: the image must be there"]


def profile_text(name: str, findings: list[HostFinding], decision: Decision, probed: ClusterProfile,
                 master: HostFinding, slots: dict[str, int], slurm: bool, partition: Optional[str],
                 ib: IbMode, workdir: Optional[str] = None) -> str:
    """The profile, with what was found on each host as comments."""
    from ..profiles.writer import ProfileText, gpu_memory_text

    out = ProfileText(name)
    stamp = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    out.header = [f"Written by `fsdpctl init {name}` on {stamp} from what each host reported:",
                  *(f"  {f.summary()}" for f in findings), *(f"warning: {w}" for w in decision.warnings), ""]
    out.field("name", name)
    out.field("backend", "slurm" if slurm else "ssh")
    if not slurm:
        entries, notes = [], []
        counts = set(slots.values())
        for finding in findings:
            entries.append({"host": finding.host, "address": decision.addresses.get(finding.host),
                            "interface": decision.host_interfaces.get(finding.host),
                            "gpus": slots.get(finding.host) if len(counts) > 1 else None})
            notes.append(f"{finding.interface} {finding.cidr or ''}".strip())
        out.hosts(entries, notes)
    nproc = next(iter(slots.values())) if len(set(slots.values())) == 1 and slots else decision.nproc_per_node
    out.field("nproc_per_node", nproc, "from the hostfile's slots" if slots and nproc != "auto" else "")
    out.field("device", decision.device)
    out.field("gpu_memory", gpu_memory_text(decision.gpu_memory_mib), "per GPU, the smallest found")
    hca = decision.ib_hca if decision.ib else None
    out.section("network", [("interface", decision.interface, "routes to the master"),
                            ("ib", decision.ib, f"--ib {ib}"), ("ib_hca", hca, "")])
    if not slurm and master.host != findings[0].host:
        out.section("rendezvous", [("host", master.host, "")])
    out.field("python", decision.python, "has torch on every host")
    out.field("workdir", workdir, "runs go to <workdir>/runs/<run id> on the nodes")
    out.comment(container_stub(findings, slurm))
    if slurm:
        probed_on = ",".join(f.host for f in findings)
        out.section("slurm", [("nodes", len(findings), f"probed on {probed_on}"), ("partition", partition, "")])
    else:
        ssh = probed.ssh
        out.section("ssh", [("user", ssh.user, ""), ("port", ssh.port, ""), ("identity_file", ssh.identity_file, ""),
                            ("known_hosts", ssh.known_hosts, "")])
    return out.text()
