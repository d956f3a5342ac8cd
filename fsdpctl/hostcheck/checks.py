"""Judge one host's probe facts, and diff the facts that must agree across hosts; the report types.

Pure: facts in, verdicts out. Each verdict that is not a pass carries a hint a person can act on.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

from ..container.runtime import short_digest
from ..profiles.schema import ClusterProfile

Status = Literal["pass", "warn", "fail"]
SHM_WARN_BYTES = 1 << 30
DISK_WARN_BYTES = 10 << 30
CLOCK_WARN_SECONDS = 30.0
PORT_WINDOW_SECONDS = 5.0
FSDP2_TORCH = "2.6"
"""The first torch whose `torch.distributed.fsdp` exports FSDP2's `fully_shard` (doctor checks the import)."""


def port_window(nodes: int) -> float:
    """Seconds the master's probe holds the rendezvous port open and the others try it: longer with
    more nodes, whose probes start over a longer spread (a launcher connects to 256 nodes over some
    seconds; on the testbed, 64 nodes' probes began 10 s apart and the 5 s window closed on them)."""
    return PORT_WINDOW_SECONDS + 0.1 * max(0, nodes)


def probe_budget(timeout: float, nodes: int, port_check: bool) -> float:
    """Seconds a node's probe may take, for ``nodes`` probed at once: the asked ``timeout``, or more
    where the launcher's own share grows with the nodes (a connection, the payload and an answer to
    read for each: at 64 nodes on a small launcher the last probes answered after 26 s), and where
    the probe waits out the port window."""
    budget = max(timeout, 20.0 + 0.5 * max(0, nodes))
    return max(budget, port_window(nodes) + 15.0) if port_check else budget


@dataclass(frozen=True)
class Check:
    """One verdict about one host (or across hosts)."""

    name: str
    status: Status
    detail: str
    hint: Optional[str] = None
    gpu: Optional[int] = None
    """The GPU's index a hardware finding is about (``doctor --health``), with its PCI ``bus_id``."""
    bus_id: Optional[str] = None


@dataclass
class HostReport:
    """Everything doctor learned about one host."""

    host: str
    node_rank: int
    facts: Optional[dict[str, Any]] = None
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    interface: Optional[str] = None
    """Its own card's name, when it was probed for one other than the profile's."""

    @property
    def status(self) -> Status:
        return _worst(c.status for c in self.checks)


@dataclass(frozen=True)
class ParityEntry:
    """One fact compared across hosts: pass when every host agrees, else the odd hosts."""

    fact: str
    status: Status
    values: dict[str, Any]
    detail: str
    hint: Optional[str] = None


@dataclass
class DoctorReport:
    """The whole verdict; ``to_json`` is the documented ``--json`` schema."""

    profile: str
    hosts: list[HostReport]
    parity: list[ParityEntry]
    seconds: float
    cluster: list[Check] = field(default_factory=list)
    """Checks of the cluster as a whole (Slurm: controller, partition, allocation)."""
    collectives: Optional[dict[str, Any]] = None
    """With ``collectives=True``: the smoke test's figures (``results``: op, bytes, seconds, algbw and
    busbw per size), or why there are none (``skipped``, ``error``)."""
    compute: Optional[dict[str, Any]] = None
    """With ``compute=True``: each rank's matmul figures (``ranks``: rank, host, local_rank, node,
    device_name, tflops), the verdict's lines (``verdict``), or why there are none."""
    links: Optional[dict[str, Any]] = None
    """With ``links=True``: every pair of nodes' bandwidth (``nodes``, ``pairs``: a, b, round, gbps),
    the rounds, the verdict's lines (``verdict``), or why there are none."""

    def status(self, strict: bool = False) -> Status:
        worst = _worst([h.status for h in self.hosts] + [p.status for p in self.parity]
                       + [c.status for c in self.cluster])
        return "fail" if strict and worst == "warn" else worst

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return self.passes()

    def passes(self, strict: bool = False) -> bool:
        """No check failed (``strict``: and none warned)."""
        return self.status(strict) != "fail"

    def failing(self, most: int = 3) -> str:
        """What failed, where: ``gpu-a: torch, packages; all hosts: nccl`` (the first ``most`` places;
        empty when nothing failed)."""
        places = [(h.host, [c.name for c in h.checks if c.status == "fail"]) for h in self.hosts]
        places += [("all hosts", [p.fact for p in self.parity if p.status == "fail"]),
                   ("cluster", [c.name for c in self.cluster if c.status == "fail"])]
        said = [f"{where}: {', '.join(names)}" for where, names in places if names]
        return "; ".join(said[:most]) + (f"; {len(said) - most} more" if len(said) > most else "")

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        return {
            "ok": self.passes(strict), "status": self.status(strict), "profile": self.profile,
            "seconds": round(self.seconds, 3),
            "hosts": [{"host": h.host, "node_rank": h.node_rank, "status": h.status, "seconds": round(h.seconds, 3),
                       "facts": h.facts, "checks": [_check_json(c) for c in h.checks]} for h in self.hosts],
            "parity": [asdict(p) for p in self.parity],
            "cluster": [asdict(c) for c in self.cluster],
            **{name: value for name in ("collectives", "compute", "links")
               if (value := getattr(self, name)) is not None},
        }


def _check_json(check: Check) -> dict[str, Any]:
    """A check as JSON: ``gpu`` and ``bus_id`` only on the hardware findings that have them."""
    data = asdict(check)
    return {k: v for k, v in data.items() if v is not None or k not in ("gpu", "bus_id")}


def _worst(statuses) -> Status:
    statuses = set(statuses)
    return "fail" if "fail" in statuses else "warn" if "warn" in statuses else "pass"


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.1f} GiB"


# ---- per-host checks --------------------------------------------------------------------------

def judge_host(profile: ClusterProfile, facts: dict[str, Any], nproc: Optional[int],
               requirements: Sequence[str] = (), interface: Optional[str] = None,
               gpus: Sequence[int] = ()) -> list[Check]:
    """The verdicts on one host's probe facts; ``requirements``: what the job needs installed;
    ``interface``: the host's own card (``hosts[].interface``), default the profile's; ``gpus``: the
    ones its ranks use (``hosts[].gpus``; empty: every GPU). The
    hardware's (``facts["health"]``) are ``health.judge_health``'s; with a container, the image's
    Python answers for the Python's checks (the container's own are ``container.judge``'s)."""
    if facts.get("container") is not None and not facts["python"].get("version"):
        # the probe could not run inside the image (its checks say why): the host's own facts only
        return _network_checks(profile, facts, interface or profile.network.interface) + _storage_checks(facts)
    checks = [Check("python", "pass", f"{facts['python']['path']} {facts['python']['version']}")]
    torch = facts.get("torch") or {}
    deep = facts.get("deep")
    if not torch.get("installed"):
        python = facts["python"]["path"]
        checks.append(Check("torch", "fail", f"torch is not installed for {python}",
                            f"{python} -m pip install torch (the build for this node's CUDA: "
                            "pytorch.org/get-started/locally), or point `python:` at the venv that has it"))
    else:
        checks.append(Check("torch", "pass", f"torch {torch.get('version')} (CUDA {torch.get('cuda') or 'none'})"))
        fsdp2 = deep.get("fsdp2_import") if deep and "fsdp2_import" in deep else torch.get("fsdp2_exported")
        checks.append(Check("fsdp2", "pass" if fsdp2 else "fail",
                            "from torch.distributed.fsdp import fully_shard " + ("works" if fsdp2 else "fails"),
                            None if fsdp2 else f"FSDP2 needs torch >= {FSDP2_TORCH}; upgrade torch on this host"))
    if deep and "import_error" in deep:
        checks.append(Check("torch-import", "fail", f"import torch failed: {deep['import_error']}",
                            "fix the torch installation on this host"))
    checks += _package_checks(facts, requirements)
    checks += _gpu_checks(profile, facts, nproc, gpus)
    checks += _network_checks(profile, facts, interface or profile.network.interface)
    checks += _storage_checks(facts)
    checks += _stack_checks(facts)
    return checks


def _package_checks(facts: dict[str, Any], requirements: Sequence[str]) -> list[Check]:
    """Every requirement of the job is met by the node's Python: installed, in the versions asked for."""
    import shlex

    from .requirements import requirement_name, unmet

    found = facts.get("packages") or {}
    python = facts["python"]["path"]
    problems = [(r, why) for r in requirements
                if (why := unmet(r, found.get(requirement_name(r)), _major_minor(facts["python"]["version"])))]
    problems = [(r, why) for r, why in problems if requirement_name(r) != "torch" or why != "not installed"]
    if problems:  # (a missing torch is the torch check's)
        return [Check("packages", "fail", "; ".join(f"{r}: {why}" for r, why in problems) + f" (for {python})",
                      f"{python} -m pip install {' '.join(shlex.quote(r) for r, _ in problems)}")]
    shown = ", ".join(f"{name} {version}" for name, version in found.items() if name != "torch")
    return [Check("packages", "pass", shown)] if shown else []


def _gpu_checks(profile: ClusterProfile, facts: dict[str, Any], nproc: Optional[int],
                chosen: Sequence[int] = ()) -> list[Check]:
    if profile.device == "cpu":
        return []
    gpus = facts.get("gpus") or {}
    deep = facts.get("deep") or {}
    count = gpus.get("count", 0) if chosen else deep["device_count"] if "device_count" in deep else gpus.get("count", 0)
    if chosen:  # (torch's own count, in the deep probe, sees the GPUs before CUDA_VISIBLE_DEVICES)
        absent = [g for g in chosen if g >= count]
        if absent:
            return [Check("gpus", "fail", f"GPU {absent[0]} is chosen (gpus {list(chosen)}) and this host has "
                          f"{count} GPU(s)", f"choose among 0-{count - 1} in hosts[].gpus" if count else
                          "no NVIDIA GPU visible here: check nvidia-smi on this host")]
        return [Check("gpus", "pass", f"GPUs {', '.join(map(str, chosen))} of {count}, driver "
                      f"{gpus.get('driver') or 'unknown'}")]
    need = nproc if nproc is not None else 1
    if count >= need and count > 0:
        return [Check("gpus", "pass", f"{count} GPU(s), driver {gpus.get('driver') or 'unknown'}")]
    status: Status = "fail" if profile.device == "cuda" else "warn"
    return [Check("gpus", status, f"{count} GPU(s) found, {need} needed",
                  "check nvidia-smi on this host, or lower nproc_per_node" if count else
                  "no NVIDIA GPU visible here; set device: cpu to train on CPU")]


def _network_checks(profile: ClusterProfile, facts: dict[str, Any], name: Optional[str]) -> list[Check]:
    checks: list[Check] = []
    interfaces = facts.get("interfaces") or {}
    if name:
        info = interfaces.get(name)
        if info is None:
            known = ", ".join(sorted(interfaces)) or "none"
            checks.append(Check("interface", "fail", f"interface {name} does not exist (has: {known})",
                                "set network.interface (or this host's hosts[].interface) to the card that "
                                "connects the nodes; `fsdpctl init` finds it"))
        elif info.get("up") is False:
            checks.append(Check("interface", "fail", f"interface {name} is {info.get('state')}",
                                f"bring it up (ip link set {name} up) or choose another interface"))
        elif info.get("ipv4") == []:
            checks.append(Check("interface", "fail", f"interface {name} has no IPv4 address",
                                "give it an address, or choose the interface that has one"))
        elif info.get("up") is None or info.get("ipv4") is None:
            # The node could not tell (no sysfs, ioctls refused): a missing fact is not a broken interface.
            what = "whether it is up" if info.get("up") is None else "its IPv4 address"
            checks.append(Check("interface", "warn", f"interface {name} exists; {what} is unknown "
                                                     f"({info.get('unknown') or 'not readable on this node'})",
                                f"check it by hand on the node (cat /sys/class/net/{name}/operstate)"))
        else:
            checks.append(Check("interface", "pass", f"{name} up, {', '.join(info['ipv4'])}, MTU {info.get('mtu')}"))
    active = [f"{dev}/{port}" for dev, ports in (facts.get("infiniband") or {}).items()
              for port, p in ports.items() if "ACTIVE" in (p.get("state") or "")]
    if profile.network.ib and not active:
        checks.append(Check("infiniband", "fail", "ib: true but no active InfiniBand port",
                            "check ibstat on this host, or set network.ib: false to use TCP"))
    elif not profile.network.ib and active:
        checks.append(Check("infiniband", "warn", f"ib: false but active ports: {', '.join(active)}",
                            "set network.ib: true to let NCCL use InfiniBand"))
    else:
        checks.append(Check("infiniband", "pass", f"active ports: {', '.join(active)}" if active else "none (TCP)"))
    checks += port_checks(facts)
    skew = abs(facts.get("clock", time.time()) - facts.get("_received", time.time()))
    if skew > CLOCK_WARN_SECONDS:
        checks.append(Check("clock", "warn", f"clock differs from this machine's by {skew:.0f} s",
                            "run NTP/chrony: logs and timeouts compare times across nodes"))
    return checks


def port_checks(facts: dict[str, Any], how: str = "") -> list[Check]:
    """The rendezvous port's verdicts from a probe's ``listen`` (the master) or ``connect`` (the
    others) answer; ``how`` is said after a verdict the port round reached (``fanout.recheck_ports``)."""
    checks = []
    listen, connect = facts.get("listen"), facts.get("connect")
    if listen is not None:
        if not listen.get("free"):
            checks.append(Check("port", "fail", f"rendezvous port {listen['port']} is taken ({listen.get('error')})",
                                "stop what holds it, or set rendezvous.port / --master-port"))
        else:
            checks.append(Check("port", "pass", f"port {listen['port']} free; reached by {len(listen['peers'])} "
                                                f"node(s){how}"))
    if connect is not None:
        if connect.get("reached"):
            checks.append(Check("port", "pass", f"reached the master at {connect['addr']}:{connect['port']}{how}"))
        else:
            checks.append(Check("port", "fail", f"cannot reach the master at {connect['addr']}:{connect['port']} "
                                                f"({connect.get('error')}){how}",
                                "check the master's address (hosts[].address) and firewalls on that port"))
    return checks


def _storage_checks(facts: dict[str, Any]) -> list[Check]:
    checks: list[Check] = []
    shm = facts.get("shm")
    if shm and shm["total_bytes"] < SHM_WARN_BYTES:
        checks.append(Check("shm", "warn", f"/dev/shm is only {_gib(shm['total_bytes'])}",
                            "NCCL and DataLoader workers use shared memory; give /dev/shm several GiB"))
    disk = facts.get("disk")
    if disk and disk["free_bytes"] < DISK_WARN_BYTES:
        checks.append(Check("disk", "warn", f"{_gib(disk['free_bytes'])} free at {disk['path']}",
                            "checkpoints need room; free space or move workdir"))
    return checks


def _stack_checks(facts: dict[str, Any]) -> list[Check]:
    """What `fsdpctl stacks` and the hang watchdog will read on this node (never a failure: Python
    frames come from fsdpctl's own dump handler without any tool)."""
    stacks = facts.get("stacks")
    if not stacks:
        return []
    py_spy, scope = stacks.get("py_spy"), stacks.get("ptrace_scope")
    if not py_spy:
        return [Check("stacks", "pass", "Python frames by fsdpctl's dump handler; no py-spy for native frames",
                      "pip install py-spy into the nodes' Python for native (C++/CUDA) frames too")]
    blocked = scope == 3 or (scope in (1, 2) and not stacks.get("root"))
    if blocked:
        return [Check("stacks", "warn", f"py-spy at {py_spy} cannot attach (kernel.yama.ptrace_scope={scope}); "
                      "Python frames only, by fsdpctl's dump handler",
                      "sysctl kernel.yama.ptrace_scope=0, or give py-spy CAP_SYS_PTRACE")]
    return [Check("stacks", "pass", f"py-spy {py_spy} (native frames too)")]


# ---- across hosts -----------------------------------------------------------------------------

def _major_minor(version: Optional[str]) -> Optional[str]:
    return ".".join(version.split(".")[:2]) if version else version


def _parity_values(profile: ClusterProfile, reports: Sequence[HostReport]) -> dict[str, dict[str, Any]]:
    """Each fact that must agree, per host; None where the host has none of it."""
    # A host whose image could not be probed fails on its own checks: it has no versions to compare.
    facts = {r.host: r.facts for r in reports if r.facts is not None
             and not ("container" in r.facts and not r.facts["python"].get("version"))}
    values: dict[str, dict[str, Any]] = {
        "torch": {h: (f.get("deep") or {}).get("version") or f["torch"].get("version") for h, f in facts.items()},
        "cuda_runtime": {h: f["torch"].get("cuda") for h, f in facts.items()},
        "nccl": {h: (f.get("deep") or {}).get("nccl") or (f["torch"].get("nccl") or {}).get("version")
                 for h, f in facts.items()},
        "python": {h: _major_minor(f["python"]["version"]) for h, f in facts.items()},
        "image": {r.host: short_digest(r.facts["container"]["digest"]) for r in reports  # where the image is
                  if r.facts is not None and (r.facts.get("container") or {}).get("digest")},
        "driver_major": {h: (f["gpus"].get("driver") or "").split(".")[0] or None for h, f in facts.items()},
    }
    for name in sorted({n for f in facts.values() for n in (f.get("packages") or {}) if n != "torch"}):
        values[name] = {h: (f.get("packages") or {}).get(name) for h, f in facts.items()}
    ib = {h: sorted({p.get("rate") for p in ((f.get("health") or {}).get("ib") or {}).values() if p.get("rate")})
          for h, f in facts.items()}
    if any(ib.values()):  # doctor --health: every host's InfiniBand ports at the same rate
        values["ib_rate"] = {h: ", ".join(rates) or None for h, rates in ib.items()}
    cards = {r.host: r.interface or profile.network.interface for r in reports if r.facts is not None}
    if any(cards.values()):  # a host without the card fails its interface check: no MTU of it to compare
        mtus = {h: (f["interfaces"].get(cards[h] or "") or {}).get("mtu") for h, f in facts.items()}
        values["mtu"] = {h: mtu for h, mtu in mtus.items() if mtu is not None}
    return values


def _shown(value: Any) -> str:
    return "not installed" if value is None else str(value)


_PARITY_HINTS = {"image": "another build of the same tag on some hosts: pull the image again there "
                          "(container.pull: always), or push one build and pull it everywhere",
                 "ib_rate": "a port trained to a lower rate (a bad cable or transceiver) slows every collective "
                           "through it: check ibstat and the cable on that host; ask the network administrator",
                 "mtu": "give the nodes' card the same MTU everywhere (ip link set dev CARD mtu N, and on the switch): "
                        "a smaller one on the path drops or fragments NCCL's packets"}


def judge_parity(profile: ClusterProfile, reports: Sequence[HostReport]) -> list[ParityEntry]:
    """Compare the facts that must be equal on every host; name the odd ones out. A fact no host has
    (CUDA, NCCL, a driver on CPU hosts) is no row at all."""
    entries = []
    for fact, values in _parity_values(profile, reports).items():
        if len(values) < 2 or all(v is None for v in values.values()):
            continue
        counts = Counter(values.values())
        if len(counts) == 1:
            entries.append(ParityEntry(fact, "pass", values, f"all {len(values)} hosts: {_shown(next(iter(counts)))}"))
            continue
        majority, _ = counts.most_common(1)[0]
        odd = sorted(h for h, v in values.items() if v != majority)
        shown = ", ".join(f"{h}={_shown(values[h])}" for h in odd)
        entries.append(ParityEntry(fact, "fail", values, f"differs on {shown} (others: {_shown(majority)})",
                                   _PARITY_HINTS.get(fact) or f"install the same {fact.replace('_', ' ')} on every "
                                   f"host; mismatches hang or corrupt collectives"))
    return entries
