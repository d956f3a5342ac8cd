"""Beside a node's ranks: sample every GPU every few seconds into the run's ``gpu/node<R>.jsonl``, and
say at once, in the node's log, when a GPU develops a fault during the run.

``python -m fsdpctl.node.gpu_watch --out FILE --every S --parent PID --node R --host H``, started by
the node script in the background before torchrun (which takes the script's PID: ``--parent``); it
leaves when that process is gone. Standard library only (shipped with the run); it asks nothing of
a node without ``nvidia-smi`` on its PATH (it leaves at once, writing nothing).

Each sample: ``{"t", "node", "host", "gpus": [{"index", "bus_id", "sm_mhz", "sm_max_mhz", "reasons",
"temp_c", "power_w", "util_pct", "mem_mib", "mem_total_mib", "ecc_uncorrected"}]}`` (a value the driver does not give
is null; ``reasons``: the active clock reasons that slow a GPU down). A fault said at once
(``HARDWARE_FAULT`` then what, on one line): a new uncorrectable ECC error, a pending row remap, an
XID that means a hardware fault appearing in the kernel log; a slowdown starting or ending is said
too (``CLOCKS``), once per change. The spare-node rule holds a node whose log says a fault against it.
"""

import argparse
import json
import os
import shutil
import sys
import time

from fsdpctl.node import health_probe

HARDWARE_FAULT = "fsdpctl: hardware fault:"
CLOCKS = "fsdpctl: GPU clocks:"
SAMPLE_FIELDS = ("index", "pci.bus_id", "clocks.sm", "clocks.max.sm", "temperature.gpu", "power.draw",
                 "utilization.gpu", "memory.used", "memory.total", "ecc.errors.uncorrected.volatile.total",
                 "remapped_rows.pending",
                 "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
                 "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
                 "clocks_event_reasons.sw_power_cap")
REASON_NAMES = {"clocks_event_reasons.hw_slowdown": "HW slowdown",
                "clocks_event_reasons.hw_thermal_slowdown": "HW thermal slowdown",
                "clocks_event_reasons.hw_power_brake_slowdown": "HW power brake",
                "clocks_event_reasons.sw_thermal_slowdown": "SW thermal slowdown",
                "clocks_event_reasons.sw_power_cap": "SW power cap"}
# XIDs that are the program's own (health.XID_PROGRAM's codes): said, not held against the node.
PROGRAM_XIDS = (13, 31, 43, 45, 94)


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def sample_gpu(row):
    """One GPU's figures from an nvidia-smi row."""
    return {"index": row.get("index"), "bus_id": row.get("pci.bus_id"), "sm_mhz": number(row.get("clocks.sm")),
            "sm_max_mhz": number(row.get("clocks.max.sm")), "temp_c": number(row.get("temperature.gpu")),
            "power_w": number(row.get("power.draw")), "util_pct": number(row.get("utilization.gpu")),
            "mem_mib": number(row.get("memory.used")), "mem_total_mib": number(row.get("memory.total")),
            "ecc_uncorrected": number(row.get("ecc.errors.uncorrected.volatile.total")),
            "remap_pending": health_probe.value(row.get("remapped_rows.pending") or "") == "Yes",
            "reasons": [name for field, name in REASON_NAMES.items()
                        if (row.get(field) or "").strip().lower() == "active"]}


def changes(before, now, where):
    """The lines to say at once: faults new since ``before`` and clock slowdowns starting or ending."""
    lines = []
    old = dict((g["index"], g) for g in before or [])
    for gpu in now:
        was = old.get(gpu["index"])
        label = "GPU %s (%s) on %s" % (gpu["index"], gpu["bus_id"], where)
        if was is None:
            was = {"ecc_uncorrected": gpu["ecc_uncorrected"], "remap_pending": gpu["remap_pending"], "reasons": []}
        if (gpu["ecc_uncorrected"] or 0) > (was["ecc_uncorrected"] or 0):
            lines.append("%s %s: new uncorrectable ECC error(s), %d since the driver loaded"
                         % (HARDWARE_FAULT, label, gpu["ecc_uncorrected"]))
        if gpu["remap_pending"] and not was["remap_pending"]:
            lines.append("%s %s: a memory row remap is pending (the GPU needs a reset)" % (HARDWARE_FAULT, label))
        if gpu["reasons"] != was["reasons"]:
            clocks = "at %s MHz of %s" % (_mhz(gpu["sm_mhz"]), _mhz(gpu["sm_max_mhz"]))
            lines.append("%s %s %s: %s" % (CLOCKS, label, clocks, ", ".join(gpu["reasons"]) or "no slowdown now"))
    return lines


def _mhz(value):
    return "?" if value is None else "%.0f" % value


def bus_key(text):
    """(domain, bus, device) from nvidia-smi's ``00000000:3B:00.0`` or an XID's ``0000:3b:00``."""
    parts = str(text or "").replace(".", ":").split(":")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
    except (ValueError, IndexError):
        return None


def new_xids(seen, where, buses=None):
    """XIDs that are hardware faults, appearing in the kernel log since the watch began (``buses``: only
    on the GPUs at these bus keys, the run's own)."""
    found = health_probe.xid_errors()
    events = found.get("events", []) if found.get("readable") else []
    count = found.get("count", 0) if found.get("readable") else seen
    fresh = events[len(events) - (count - seen):] if count > seen else []
    lines = []
    for event in fresh:
        if event["code"] not in PROGRAM_XIDS and (buses is None or bus_key(event["pci"]) in buses):
            lines.append("%s XID %d on PCI %s of %s: %s" % (HARDWARE_FAULT, event["code"], event["pci"], where,
                                                        event["text"] or "see NVIDIA's XID catalog"))
    return count, lines


def fault_in_log(text):
    """The first hardware fault the watcher said in a node's log since the node last started (its
    script's ``fsdpctl: node R of N`` line: a log a spare continues holds the replaced host's), or None."""
    start = text.rfind("fsdpctl: node ")
    at = text.find(HARDWARE_FAULT, max(0, start))
    if at < 0:
        return None
    return text[at + len(HARDWARE_FAULT):].split("\n", 1)[0].strip()


def started_at(pid):
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), None where unknown:
    with it, a PID the kernel gave to another process since is not taken for the parent."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def alive(pid, started=None):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or started_at(pid) == started


def watch(out, every, parent, node, host, only=None):
    """Sample until ``parent`` is gone; ``only``: the indices of the run's own GPUs (None: every GPU)."""
    where = host or "node %s" % node
    xids = health_probe.xid_errors()
    seen = xids.get("count", 0) if xids.get("readable") else 0
    before = None
    known = health_probe.known_fields("gpu")  # once: the driver does not change under a run
    started = started_at(parent)
    while alive(parent, started) and known is not None:
        rows = health_probe.query("gpu", SAMPLE_FIELDS, known)
        if "rows" in rows:
            gpus = [g for g in map(sample_gpu, rows["rows"]) if only is None or str(g["index"]) in only]
            seen, faults = new_xids(seen, where, None if only is None else {bus_key(g["bus_id"]) for g in gpus})
            for line in changes(before, gpus, where) + faults:
                print(line, flush=True)
            before = gpus
            with open(out, "a") as handle:
                handle.write(json.dumps({"t": round(time.time(), 3), "node": node, "host": host, "gpus": gpus}) + "\n")
        deadline = time.time() + every
        while time.time() < deadline and alive(parent, started):
            time.sleep(min(0.5, every))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fsdpctl.node.gpu_watch", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--every", type=float, default=5.0)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--node", type=int, default=0)
    parser.add_argument("--host", default="")
    parser.add_argument("--gpus", default="", help="the run's own GPUs, by index (2,4); default: every GPU")
    args = parser.parse_args(argv)
    if shutil.which("nvidia-smi") is None or args.every <= 0:
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    try:
        watch(args.out, args.every, args.parent, args.node, args.host, set(args.gpus.split(",")) if args.gpus else None)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
