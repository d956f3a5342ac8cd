"""What ``fsdpctl init`` makes of each host's probe: the card that routes to the master, InfiniBand,
GPUs and Python, where the hosts disagree, and the profile values they lead to (or why there is
no one value)."""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

IbMode = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class HostFinding:
    """One host as its probe described it (``error``: it could not be probed)."""

    host: str
    node_rank: int
    hostname: Optional[str] = None
    error: Optional[str] = None
    interface: Optional[str] = None
    """The interface that routes to the master (on the master: the one holding its address)."""
    source: Optional[str] = None
    """The address this host's traffic to the master leaves from."""
    route: str = ""
    """How the route was learned."""
    cidr: Optional[str] = None
    mtu: Optional[int] = None
    nccl_default: Optional[str] = None
    """The interface NCCL would pick on its own."""
    ib_ports: tuple[tuple[str, str, str, str], ...] = ()
    """(device, port, state, link layer) of every InfiniBand/RoCE port."""
    plugins: tuple[str, ...] = ()
    gpu_count: int = 0
    gpu_names: tuple[str, ...] = ()
    gpu_memory_mib: Optional[int] = None
    """The smallest GPU's memory on this host."""
    python: Optional[str] = None
    """An interpreter with torch (None: none found)."""
    python_version: Optional[str] = None
    torch: Optional[str] = None
    cuda: Optional[str] = None
    nccl: Optional[str] = None
    tried: tuple[str, ...] = ()
    runtimes: tuple[tuple[str, str], ...] = ()
    """(runtime, its version line) of every container runtime on PATH."""
    """Interpreters looked at for torch."""

    @property
    def subnet(self) -> Optional[str]:
        return str(ipaddress.ip_interface(self.cidr).network) if self.cidr else None

    @property
    def active_ports(self) -> list[str]:
        return [f"{dev}/{port}" for dev, port, state, _ in self.ib_ports if "ACTIVE" in state.upper()]

    @property
    def active_devices(self) -> list[str]:
        return sorted({dev for dev, _, state, _ in self.ib_ports if "ACTIVE" in state.upper()})

    def summary(self) -> str:
        """One comment's worth: what was found."""
        if self.error:
            return f"not probed: {self.error}"
        ib = ", ".join(f"{d}/{p} {s.split(':')[-1].strip()} ({layer})" for d, p, s, layer in self.ib_ports) or "none"
        gpus = (f"{self.gpu_count} x {self.gpu_names[0]} ({self.gpu_memory_mib} MiB)" if self.gpu_count and
                self.gpu_names else f"{self.gpu_count}" if self.gpu_count else "none")
        torch = (f"torch {self.torch} (CUDA {self.cuda or 'none'}, NCCL {self.nccl or 'none'})" if self.torch
                 else "no torch found" + (f" (tried {', '.join(self.tried)})" if self.tried else ""))
        default = "" if self.nccl_default in (None, self.interface) else \
            f"; NCCL alone would pick {self.nccl_default}"
        return (f"{self.hostname or self.host}: {self.interface} {self.cidr or self.source} mtu {self.mtu}, "
                f"{self.route}{default}; InfiniBand/RoCE: {ib}; NCCL net plugins: "
                f"{', '.join(p.rsplit('/', 1)[-1] for p in self.plugins) or 'none'}; GPUs: {gpus}; "
                f"python {self.python or '-'} {self.python_version or ''}, {torch}")


def finding_of(host: str, node_rank: int, facts: Optional[dict[str, Any]], error: Optional[str]) -> HostFinding:
    """A host's probe facts (with ``init``'s discoveries) as a finding."""
    if facts is None or "init" not in facts:
        return HostFinding(host=host, node_rank=node_rank, error=error or "the probe gave no answer")
    init, interfaces = facts["init"], facts.get("interfaces") or {}
    route = init.get("route") or {}
    name = route.get("interface")
    card = interfaces.get(name or "", {})
    source = route.get("source")
    cidr = next((c for c in card.get("ipv4") or [] if c.split("/")[0] == source), (card.get("ipv4") or [None])[0])
    ports = tuple((dev, port, info.get("state", ""), info.get("link_layer", ""))
                  for dev, dev_ports in sorted((facts.get("infiniband") or {}).items())
                  for port, info in sorted(dev_ports.items()))
    gpus = facts.get("gpus") or {}
    memory = [m for m in gpus.get("memory_mib") or [] if m]
    torch, python, version, tried = facts.get("torch") or {}, facts["python"]["path"], facts["python"]["version"], ()
    if not torch.get("installed"):
        candidates = init.get("pythons") or []
        tried = tuple(c["path"] for c in candidates)
        found = next((c for c in candidates if c["torch"].get("installed")), None)
        torch, python, version = (found["torch"], found["path"], found["version"]) if found else ({}, None, None)
    problem = route.get("error")
    return HostFinding(
        host=host, node_rank=node_rank, hostname=facts.get("hostname"), error=problem and f"no route: {problem}",
        interface=name, source=source, route=route.get("how", ""), cidr=cidr, mtu=card.get("mtu"),
        nccl_default=init.get("nccl_default"), ib_ports=ports,
        plugins=tuple(init.get("net_plugins", {}).get("libraries") or ()), gpu_count=int(gpus.get("count") or 0),
        gpu_names=tuple(gpus.get("names") or ()), gpu_memory_mib=min(memory) if memory else None,
        python=python, python_version=version, torch=torch.get("version"), cuda=torch.get("cuda"),
        nccl=torch.get("nccl"), tried=tried, runtimes=tuple(sorted((init.get("runtimes") or {}).items())))


@dataclass(frozen=True)
class Row:
    """One fact compared across hosts: ``ok`` when they agree, ``differs`` (a warning), ``refused``
    (no profile value can hold it) or ``fails`` (doctor will fail until it is fixed)."""

    fact: str
    values: dict[str, str]
    status: str
    note: str = ""


@dataclass
class Decision:
    """The profile values the findings lead to, what to warn about, and what cannot be written."""

    interface: Optional[str] = None
    host_interfaces: dict[str, str] = field(default_factory=dict)
    """Hosts whose routed card has another name than ``interface``."""
    addresses: dict[str, str] = field(default_factory=dict)
    ib: bool = False
    ib_hca: Optional[str] = None
    device: str = "cpu"
    nproc_per_node: Any = 1
    gpu_memory_mib: Optional[int] = None
    python: Optional[str] = None
    rows: list[Row] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)


def _row(decision: Decision, fact: str, values: dict[str, Any], bad: str = "differs", note: str = "") -> bool:
    shown = {host: "-" if value is None else str(value) for host, value in values.items()}
    same = len(set(shown.values())) <= 1
    decision.rows.append(Row(fact, shown, "ok" if same else bad, "" if same else note))
    return same


def decide(findings: list[HostFinding], master: HostFinding, ib_mode: IbMode, python_given: Optional[str]) -> Decision:
    """The profile's values, or the refusals that name the hosts."""
    decision = Decision()
    broken = [f for f in findings if f.error]
    for finding in broken:
        decision.refusals.append(f"{finding.host}: {finding.error}")
    usable = [f for f in findings if not f.error]
    if not usable:
        return decision
    by = {f.host: f for f in usable}
    names = Counter(f.interface for f in usable)
    decision.interface = (by.get(master.host) or usable[0]).interface if len(names) > 1 else usable[0].interface
    decision.host_interfaces = {f.host: f.interface for f in usable if f.interface != decision.interface}
    decision.addresses = {f.host: f.source or f.host for f in usable}
    _row(decision, "interface to the master", {f.host: f.interface for f in usable}, "differs",
         "each host gets its own (hosts[].interface)")
    if not _row(decision, "mtu", {f.host: f.mtu for f in usable}, "differs"):
        decision.warnings.append("the MTU differs between hosts (" + ", ".join(f"{f.host} {f.mtu}" for f in usable)
                                 + "): large messages can stall; set one MTU on every host's card")
    if not _row(decision, "subnet", {f.host: f.subnet for f in usable}, "differs"):
        decision.warnings.append("the hosts' cards are on different subnets: the route between them goes through a "
                                 "gateway")
    for finding in usable:
        if finding.nccl_default and finding.nccl_default != finding.interface:
            decision.warnings.append(f"{finding.host}: NCCL alone would pick {finding.nccl_default}, not "
                                     f"{finding.interface} (which routes to the master): the profile names the "
                                     f"interface for it")
    _decide_ib(decision, usable, ib_mode)
    _decide_gpus(decision, usable)
    _decide_python(decision, usable, python_given)
    return decision


def _decide_ib(decision: Decision, usable: list[HostFinding], ib_mode: IbMode) -> None:
    ports = {f.host: ",".join(f.active_ports) or "none" for f in usable}
    with_ports = [f for f in usable if f.active_ports]
    _row(decision, "InfiniBand/RoCE ports up", ports, "differs", "used by nobody unless every host has one")
    if ib_mode == "off":
        decision.ib = False
    elif len(with_ports) == len(usable):
        decision.ib = True
        devices = {",".join(f.active_devices) for f in usable}
        decision.ib_hca = devices.pop() if len(devices) == 1 else None
    elif ib_mode == "on":
        missing = ", ".join(f.host for f in usable if not f.active_ports)
        decision.refusals.append(f"--ib on: no InfiniBand/RoCE port is up on {missing}")
    elif with_ports:
        decision.warnings.append("InfiniBand/RoCE ports are up on " + ", ".join(f.host for f in with_ports) +
                                 " only: NCCL uses sockets (ib: false) so that every node speaks the same transport")
    plugins = {f.host: ",".join(p.rsplit("/", 1)[-1] for p in f.plugins) or "none" for f in usable}
    _row(decision, "NCCL net plugins", plugins, "differs")
    if not decision.ib and any(f.plugins for f in usable):
        decision.warnings.append("NCCL net plugins are installed (" + ", ".join(sorted({p for f in usable for p in
                                 f.plugins})) + "): with ib: false the profile selects NCCL's socket transport "
                                 "(NCCL_NET=Socket) so no plugin tries RDMA")


def _decide_gpus(decision: Decision, usable: list[HostFinding]) -> None:
    counts = {f.host: f.gpu_count for f in usable}
    _row(decision, "GPUs", counts, "differs")
    _row(decision, "GPU model", {f.host: (f.gpu_names or ("-",))[0] for f in usable}, "differs")
    with_gpus = [f for f in usable if f.gpu_count]
    if with_gpus and len(with_gpus) != len(usable):
        none = ", ".join(f.host for f in usable if not f.gpu_count)
        decision.refusals.append(f"GPUs on {', '.join(f.host for f in with_gpus)} but none on {none}: device cuda "
                                 f"and cpu cannot be one profile; give the hosts of one kind")
        return
    if with_gpus:
        decision.device, decision.nproc_per_node = "cuda", "auto"
        memory = [f.gpu_memory_mib for f in with_gpus if f.gpu_memory_mib]
        decision.gpu_memory_mib = min(memory) if memory else None
        if len(set(counts.values())) > 1:
            decision.warnings.append("the hosts have different GPU counts: nproc_per_node: auto starts one rank per "
                                     "GPU on each")
    else:
        decision.device, decision.nproc_per_node = "cpu", 1


def _decide_python(decision: Decision, usable: list[HostFinding], python_given: Optional[str]) -> None:
    paths = {f.host: f.python for f in usable}
    if not _row(decision, "python with torch", paths, "refused", "the profile has one python: the same path on "
                                                                 "every host"):
        decision.refusals.append("python: " + ", ".join(f"{h} {p or 'none found'}" for h, p in paths.items()) +
                                 ": one profile value; install at the same path everywhere, or give --python")
    decision.python = python_given or next((p for p in paths.values() if p), None)
    missing = [f for f in usable if not f.python]
    if missing:
        decision.warnings.append("no Python with torch on " + ", ".join(f.host for f in missing) + ": doctor and "
                                 "launch will fail there until it is installed (or give --python)")
    for fact, name in (("torch", "torch"), ("cuda", "CUDA runtime"), ("nccl", "NCCL"), ("python_version", "Python")):
        if not _row(decision, name, {f.host: getattr(f, fact) for f in usable}, "fails"):
            decision.warnings.append(f"{name} differs between hosts: doctor fails until every host has the same")
