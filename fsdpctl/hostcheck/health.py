"""Judge one host's hardware facts (``fsdpctl.node.health_probe``): GPU faults, limits and busy GPUs,
XID errors, DCGM's quick diagnostic, InfiniBand error counters. Pure: facts in, verdicts out.

Every finding names the GPU (index and PCI bus id) and says what to do or whom to call. A fact the
driver does not give is skipped, never failed. What fails: what breaks or corrupts a run (an
uncorrectable ECC error since the driver loaded, a row remap pending or failed, a GPU that refuses
compute, a hardware clock slowdown, an XID that means a hardware fault, a failed DCGM run, another
process on a GPU unless allowed). What warns: what makes a run slower or is history (a power cap, a
narrower PCIe link, software thermal slowdown, heat, ECC errors over the GPU's life, link error
counters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from .checks import Check

TEMPERATURE_WARN_C = 85
# Memory a GPU may show in use with no process listed (the driver's own reservations stay well below).
UNSEEN_MEMORY_MIB = 2048
ADMIN = "drain the node and tell its administrator"
# XIDs that usually come from the program (a bad kernel, an illegal address), not the hardware: warned.
XID_PROGRAM = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
               45: "preemptive cleanup", 94: "contained ECC error (the process was ended, the GPU goes on)"}
XID_HARDWARE = {48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
                62: "internal micro-controller halt", 63: "ECC page retirement or row remap recorded",
                64: "ECC page retirement or row remap failed", 74: "NVLink error", 79: "GPU has fallen off the bus",
                92: "high single-bit ECC error rate", 95: "uncontained ECC error", 119: "GSP RPC timeout",
                120: "GSP error", 140: "unrecovered ECC error"}
# Clock reasons: the ones that mean trouble, how bad, and what to do.
CLOCK_REASONS = (
    ("clocks_event_reasons.hw_slowdown", "HW slowdown", "fail",
     "the board slows itself (overheating, a power-supply fault or an external brake): " + ADMIN),
    ("clocks_event_reasons.hw_thermal_slowdown", "HW thermal slowdown", "fail",
     "the GPU is too hot: check its cooling and airflow; " + ADMIN),
    ("clocks_event_reasons.hw_power_brake_slowdown", "HW power brake", "fail",
     "the power supply asserted its brake: " + ADMIN),
    ("clocks_event_reasons.sw_thermal_slowdown", "SW thermal slowdown", "warn",
     "the driver keeps the GPU below its temperature target: check cooling"),
)


def gpu_label(gpu: Mapping[str, Any]) -> str:
    """``GPU 3 (00000000:3B:00.0)``."""
    return f"GPU {gpu.get('index')} ({gpu.get('pci.bus_id') or 'bus id unknown'})"


def _number(text: Any) -> Optional[float]:
    try:
        return float(str(text).split()[0])
    except (TypeError, ValueError, IndexError):
        return None


def _yes(text: Any) -> bool:
    return str(text).strip().lower() in ("yes", "active", "1", "true")


def _bus_key(text: Any) -> Optional[tuple[int, int, int]]:
    """(domain, bus, device) from ``00000000:3B:00.0`` or an XID's ``0000:3b:00``."""
    parts = str(text or "").replace(".", ":").split(":")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
    except (ValueError, IndexError):
        return None


def _finding(name: str, gpu: Mapping[str, Any], status: str, what: str, hint: Optional[str]) -> Check:
    index = _number(gpu.get("index"))
    return Check(name, status, f"{gpu_label(gpu)}: {what}", hint, gpu=int(index) if index is not None else None,
                 bus_id=gpu.get("pci.bus_id"))


def gpu_findings(gpu: Mapping[str, Any]) -> list[Check]:
    """What is wrong with one GPU: memory faults, clock slowdowns, limits, compute mode, heat."""
    out: list[Check] = []
    volatile = _number(gpu.get("ecc.errors.uncorrected.volatile.total"))
    aggregate = _number(gpu.get("ecc.errors.uncorrected.aggregate.total"))
    if volatile:
        out.append(_finding("gpu-health", gpu, "fail", f"{volatile:.0f} uncorrectable ECC error(s) since the driver "
                            "loaded", "reset the GPU (nvidia-smi -r) or reboot the node; if they come back the GPU "
                            "needs replacing: " + ADMIN))
    elif aggregate:
        out.append(_finding("gpu-health", gpu, "warn", f"{aggregate:.0f} uncorrectable ECC error(s) over its life",
                            "none since the driver loaded; watch it, and tell the administrator if it grows"))
    if _yes(gpu.get("remapped_rows.failure")):
        out.append(_finding("gpu-health", gpu, "fail", "row remapping failed: memory rows could not be replaced",
                            "the GPU needs replacing (RMA): " + ADMIN))
    if _yes(gpu.get("remapped_rows.pending")) or _yes(gpu.get("retired_pages.pending")):
        out.append(_finding("gpu-health", gpu, "fail", "a memory row remap (page retirement) is pending",
                            "reset the GPU (nvidia-smi -r, as root, nothing running on it) or reboot the node "
                            "to apply it"))
    for field, words, status, hint in CLOCK_REASONS:
        if _yes(gpu.get(field)):
            clocks = f" at {gpu.get('clocks.sm')} MHz of {gpu.get('clocks.max.sm')}" if gpu.get("clocks.sm") else ""
            out.append(_finding("gpu-health", gpu, status, f"{words} active{clocks}", hint))
    out += _limits(gpu)
    return out


def _limits(gpu: Mapping[str, Any]) -> list[Check]:
    out: list[Check] = []
    limit, default = _number(gpu.get("power.limit")), _number(gpu.get("power.default_limit"))
    if limit is not None and default and limit < default - 1:
        out.append(_finding("gpu-health", gpu, "warn", f"power limit {limit:.0f} W, below its default {default:.0f} W",
                            f"nvidia-smi -i {gpu.get('index')} -pl {default:.0f} (as root), or ask the administrator"))
    width, widest = _number(gpu.get("pcie.link.width.current")), _number(gpu.get("pcie.link.width.max"))
    if width is not None and widest and width < widest:
        out.append(_finding("gpu-health", gpu, "warn", f"PCIe link x{width:.0f} of x{widest:.0f}",
                            "reseat the card or check the slot and riser: " + ADMIN))
    gen, top = _number(gpu.get("pcie.link.gen.gpucurrent")), _number(gpu.get("pcie.link.gen.max"))
    idle = _yes(gpu.get("clocks_event_reasons.gpu_idle"))
    if gen is not None and top and gen < top and not idle:  # an idle GPU lowers its link generation to save power
        out.append(_finding("gpu-health", gpu, "warn", f"PCIe gen {gen:.0f} of {top:.0f} while busy",
                            "check the slot's BIOS link settings and the riser: " + ADMIN))
    mode = str(gpu.get("compute_mode") or "")
    if mode.lower() == "prohibited":
        out.append(_finding("gpu-health", gpu, "fail", "compute mode Prohibited: no process may use it",
                            f"nvidia-smi -i {gpu.get('index')} -c DEFAULT (as root)"))
    elif mode.lower().startswith("exclusive"):
        out.append(_finding("gpu-health", gpu, "warn", f"compute mode {mode}: a second process on it is refused "
                            "(a profiler, a stray rank)", f"nvidia-smi -i {gpu.get('index')} -c DEFAULT (as root) "
                            "if more than one process must reach it"))
    heat = _number(gpu.get("temperature.gpu"))
    if heat is not None and heat >= TEMPERATURE_WARN_C:
        out.append(_finding("gpu-health", gpu, "warn", f"{heat:.0f} C", "check the node's cooling before a long run"))
    return out


def busy_findings(gpus: Sequence[Mapping[str, Any]], apps: Sequence[Mapping[str, Any]], apps_known: bool,
                  allow_busy: bool) -> list[Check]:
    """Processes already on a GPU (another user's job): a failure unless ``allow_busy``."""
    status = "warn" if allow_busy else "fail"
    hint = None if allow_busy else ("stop them, or pick free hosts; --allow-busy-gpus (health.allow_busy_gpus) "
                                    "starts anyway, sharing the GPU")
    by_bus: dict[Any, list[Mapping[str, Any]]] = {}
    for app in apps:
        by_bus.setdefault(_bus_key(app.get("gpu_bus_id")), []).append(app)
    out: list[Check] = []
    for gpu in gpus:
        mine = by_bus.get(_bus_key(gpu.get("pci.bus_id")), [])
        if mine:
            named = ", ".join(f"pid {a.get('pid')} ({a.get('process_name') or '?'}, {a.get('used_memory') or '?'} MiB)"
                              for a in mine)
            out.append(_finding("gpu-busy", gpu, status, f"in use by {named}", hint))
            continue
        used = _number(gpu.get("memory.used"))
        if apps_known and used is not None and used > UNSEEN_MEMORY_MIB:
            out.append(_finding("gpu-busy", gpu, status, f"{used:.0f} MiB in use by processes this host does not "
                                "show (another container or user)", hint))
    return out


def xid_findings(xid: Optional[Mapping[str, Any]], gpus: Sequence[Mapping[str, Any]]) -> list[Check]:
    """NVIDIA XID errors since boot, each on its GPU; a program's own XIDs only warn."""
    if not xid:
        return []
    if not xid.get("readable"):
        return [Check("xid", "pass", f"kernel log not readable here ({xid.get('why')}): XID errors unknown",
                      "run doctor as a user that may read it (dmesg), or set kernel.dmesg_restrict=0")]
    by_bus = {_bus_key(g.get("pci.bus_id")): g for g in gpus}
    seen: dict[tuple[Any, int], int] = {}
    for event in xid.get("events", []):
        key = (_bus_key(event.get("pci")), int(event.get("code", 0)))
        seen[key] = seen.get(key, 0) + 1
    out: list[Check] = []
    for (bus, code), times in sorted(seen.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        gpu = by_bus.get(bus) or {"index": "?", "pci.bus_id": next(
            (e.get("pci") for e in xid.get("events", []) if _bus_key(e.get("pci")) == bus), None)}
        what = XID_HARDWARE.get(code) or XID_PROGRAM.get(code) or "see NVIDIA's XID catalog"
        if code in XID_PROGRAM:
            out.append(_finding("xid", gpu, "warn", f"XID {code} ({what}) x{times} since boot",
                                "usually the program's own fault; if no program of yours caused it, " + ADMIN))
        else:
            out.append(_finding("xid", gpu, "fail", f"XID {code} ({what}) x{times} since boot",
                                "a hardware fault: " + ADMIN + " (a reset or reboot clears the log once fixed)"))
    return out or [Check("xid", "pass", f"no XID error in the kernel log ({xid.get('source')})")]


def dcgm_findings(dcgm: Optional[Mapping[str, Any]], asked: bool) -> list[Check]:
    if not asked:
        return []
    if dcgm is None:
        return [Check("dcgm", "pass", "DCGM not installed: dcgmi diag skipped")]
    if dcgm.get("status") == 0 and not dcgm.get("failures"):
        return [Check("dcgm", "pass", "dcgmi diag -r 1 passed")]
    failures = "; ".join(dcgm.get("failures") or dcgm.get("last_lines") or ["no output"])
    return [Check("dcgm", "fail", f"dcgmi diag -r 1 failed: {failures}",
                  "read `dcgmi diag -r 1` on the node: " + ADMIN)]


def ib_findings(ports: Optional[Mapping[str, Any]]) -> list[Check]:
    """InfiniBand ports whose error counters are not zero."""
    if not ports:
        return []
    out = []
    for name, port in sorted(ports.items()):
        errors = {k: v for k, v in (port.get("counters") or {}).items() if v}
        if errors:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(errors.items()))
            out.append(Check("ib-health", "warn", f"{name} ({port.get('rate')}): {shown}",
                             "a flaky cable or port slows every collective through it: reseat or replace it "
                             "(perfquery -x shows the counters; ask the network administrator)"))
    return out or [Check("ib-health", "pass", f"{len(ports)} port(s), no error counted")]


def judge_health(device: str, facts: Mapping[str, Any], asked: Optional[Mapping[str, Any]],
                 chosen: Sequence[int] = ()) -> list[Check]:
    """The hardware verdicts on one host's probe facts, when its probe was ``asked`` (``xid`` set:
    doctor --health, not the preflight's GPU part alone; ``allow_busy``: other processes only warn).
    ``chosen``: the GPUs the run uses (``hosts[].gpus``; empty: all): the others are not judged."""
    if not asked or "health" not in facts:
        return []
    health = facts["health"]
    if chosen and isinstance(health.get("gpus"), Mapping) and "gpus" in health["gpus"]:
        rows = [g for g in health["gpus"]["gpus"] or [] if str(g.get("index")) in {str(c) for c in chosen}]
        health = {**health, "gpus": {**health["gpus"], "gpus": rows}}
        xid = health.get("xid")
        if isinstance(xid, Mapping) and xid.get("events"):  # another GPU's faults are not this run's
            buses = {_bus_key(g.get("pci.bus_id")) for g in rows}
            health["xid"] = {**xid, "events": [e for e in xid["events"] if _bus_key(e.get("pci")) in buses]}
    return health_checks(health, device, bool(asked.get("allow_busy")), full=bool(asked.get("xid")))


def health_checks(health: Mapping[str, Any], device: str, allow_busy: bool = False,
                  full: bool = True) -> list[Check]:
    """Every health verdict on one host; ``full``: doctor --health (XID, DCGM, IB) rather than the
    preflight's GPU part alone."""
    smi = health.get("gpus")
    out: list[Check] = []
    if smi is None:
        if device == "cuda":
            out.append(Check("gpu-health", "warn", "no nvidia-smi on PATH: GPU health unknown",
                             "install the NVIDIA driver's utilities on this host, or put nvidia-smi on PATH"))
    elif smi.get("error"):
        out.append(Check("gpu-health", "fail", f"nvidia-smi failed: {smi['error']}",
                         "run nvidia-smi on the node: a driver that does not answer cannot run a job; " + ADMIN))
    else:
        gpus = smi.get("gpus") or []
        found = [c for g in gpus for c in gpu_findings(g)]
        missing = smi.get("missing") or []
        note = f"; not given by this driver: {', '.join(missing)}" if missing else ""
        out += found or [Check("gpu-health", "pass", f"{len(gpus)} GPU(s): no fault, slowdown or limit{note}")]
        busy = busy_findings(gpus, smi.get("apps") or [], "apps_error" not in smi, allow_busy)
        out += busy or [Check("gpu-busy", "pass", f"no other process on the {len(gpus)} GPU(s)")]
        if full:
            out += xid_findings(health.get("xid"), gpus)
    if full:
        out += dcgm_findings(health.get("dcgm"), "dcgm" in health)
        out += ib_findings(health.get("ib"))
    return out
