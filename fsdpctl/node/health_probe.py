"""What ``doctor --health`` (and launch's preflight) learns of a node's hardware (appended to the
probe's source, and run by it when its argument asks ``health``): every GPU's faults, limits and
current state from ``nvidia-smi``, the processes already on a GPU, NVIDIA's XID errors in the kernel
log, ``dcgmi diag -r 1`` where DCGM is installed, and the InfiniBand ports' state and error counters.

Standard library only, Python 3.8-compatible, no tool assumed: nvidia-smi refuses a whole query when
one field is unknown to its driver, so the fields asked for are those its own ``--help-query-gpu``
lists; a field the driver lacks is left out (reported in ``missing``), never a failure.
"""

import os
import re
import shutil
import subprocess

GPU_FIELDS = (
    "index", "pci.bus_id", "name", "uuid",
    "ecc.mode.current", "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "remapped_rows.pending", "remapped_rows.failure", "retired_pages.pending", "retired_pages.double_bit.count",
    "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap", "clocks_event_reasons.gpu_idle",
    "power.limit", "power.default_limit", "power.draw",
    "pcie.link.gen.gpucurrent", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "compute_mode", "temperature.gpu", "clocks.sm", "clocks.max.sm", "utilization.gpu",
    "memory.used", "memory.total",
)
# Older drivers name the clock reasons "throttle" and lack gpucurrent: asked for when the new name is unknown.
FIELD_ALIASES = {"clocks_event_reasons.": "clocks_throttle_reasons.",
                 "pcie.link.gen.gpucurrent": "pcie.link.gen.current"}
APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_bus_id", "gpu_uuid")
# What nvidia-smi prints for a value the GPU or driver cannot give.
NOT_A_VALUE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient Permissions]",
               "[GPU requires reset]", "")
IB_COUNTERS = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
               "port_rcv_remote_physical_errors", "port_xmit_discards", "local_link_integrity_errors",
               "excessive_buffer_overrun_errors")
KMSG = "/dev/kmsg"
XID_PATTERN = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),? ?(.*)")


def smi(args, timeout=15):
    """(exit status, stdout, stderr) of nvidia-smi; status None when it could not run at all."""
    try:
        out = subprocess.run(["nvidia-smi"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=timeout, universal_newlines=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, "", str(exc)
    return out.returncode, out.stdout, out.stderr


def known_fields(switch):
    """The fields nvidia-smi accepts for ``switch`` (``gpu``, ``compute-apps``): every quoted name its
    help lists (``"name" or "gpu_name"``)."""
    status, out, _ = smi(["--help-query-" + switch])
    if status != 0:
        return None
    names = set()
    for line in out.splitlines():
        if line.startswith('"'):
            names.update(re.findall(r'"([A-Za-z0-9_.]+)"', line))
    return names


def pick_fields(wanted, known):
    """(fields to ask for as (wanted name, name asked), the wanted names the driver lacks); an old
    driver's name for a field stands in for it."""
    asked, missing = [], []
    for name in wanted:
        alias = next((old + name[len(new):] for new, old in FIELD_ALIASES.items() if name.startswith(new)), None)
        if name in known:
            asked.append((name, name))
        elif alias in known:
            asked.append((name, alias))
        else:
            missing.append(name)
    return asked, missing


def value(text):
    text = text.strip()
    return None if text in NOT_A_VALUE else text


def query(switch, wanted, known=None):
    """Rows of ``nvidia-smi --query-<switch>`` as dicts keyed by the wanted names, with the names the
    driver lacks; or an error. ``known``: the fields the driver lists, when already asked."""
    known = known_fields(switch) if known is None else known
    if known is None:
        return {"error": "nvidia-smi --help-query-%s failed" % switch}
    asked, missing = pick_fields(wanted, known)
    status, out, err = smi(["--query-%s=%s" % (switch, ",".join(a for _, a in asked)),
                            "--format=csv,noheader,nounits"])
    if status != 0:
        return {"error": "nvidia-smi --query-%s exited %s: %s" % (switch, status, (err or out).strip()[:300])}
    rows = []
    for line in out.splitlines():
        if line.strip():
            cells = line.split(",")
            if len(cells) == len(asked):  # a process name with a comma would shift the columns: dropped
                rows.append(dict((name, value(cell)) for (name, _), cell in zip(asked, cells)))
    return {"rows": rows, "missing": missing}


def gpu_health():
    """Every GPU's health fields and the compute processes on them (None: no nvidia-smi here)."""
    path = shutil.which("nvidia-smi")
    if path is None:
        return None
    gpus = query("gpu", GPU_FIELDS)
    found = {"tool": path, "gpus": gpus.get("rows", []), "missing": gpus.get("missing", [])}
    if "error" in gpus:
        found["error"] = gpus["error"]
        return found
    apps = query("compute-apps", APP_FIELDS)
    found["apps"] = apps.get("rows", [])
    if "error" in apps:
        found["apps_error"] = apps["error"]
    return found


def kernel_log():
    """The kernel log since boot as text, and how it was read (None, why: not readable here)."""
    if shutil.which("dmesg"):
        try:
            out = subprocess.run(["dmesg"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10,
                                 universal_newlines=True, errors="replace")
            if out.returncode == 0:
                return out.stdout, "dmesg"
            why = out.stderr.strip()[:200] or "dmesg exited %d" % out.returncode
        except (OSError, subprocess.SubprocessError) as exc:
            why = str(exc)
    else:
        why = "no dmesg on PATH"
    try:  # without dmesg (a slim image), the kernel's own record device, read to its end
        fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return None, "%s; %s: %s" % (why, KMSG, exc.strerror or exc)
    records = []
    try:
        while len(records) < 200000:  # one record per read; EAGAIN at the end of the log
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; the next read goes on
                continue
            if not chunk:
                break
            records.extend(line.split(";", 1)[-1] for line in chunk.decode("utf-8", "replace").splitlines(True))
    finally:
        os.close(fd)
    return "".join(records), KMSG


def xid_errors():
    """NVIDIA's XID errors since boot: [{pci, code, text}], or why the kernel log is not readable."""
    text, source = kernel_log()
    if text is None:
        return {"readable": False, "why": source}
    events = []
    for match in XID_PATTERN.finditer(text):
        events.append({"pci": match.group(1), "code": int(match.group(2)), "text": match.group(3).strip()[:200]})
    return {"readable": True, "source": source, "events": events[-50:], "count": len(events)}


def dcgm_diag(timeout=120):
    """``dcgmi diag -r 1`` (DCGM's quick readiness run): None where DCGM is not installed."""
    path = shutil.which("dcgmi")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "diag", "-r", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             timeout=timeout, universal_newlines=True, errors="replace")
    except subprocess.TimeoutExpired:
        return {"tool": path, "status": None, "failures": ["timed out after %d s" % timeout]}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"tool": path, "status": None, "failures": [str(exc)]}
    failures = [" ".join(line.replace("|", " ").split()) for line in out.stdout.splitlines()
                if re.search(r"\bFail\b", line, re.I)]
    return {"tool": path, "status": out.returncode, "failures": failures[:20],
            "last_lines": out.stdout.strip().splitlines()[-5:]}


def ib_ports(root="/sys/class/infiniband"):
    """Each InfiniBand port's state, physical state, rate and error counters, from sysfs."""
    import glob

    def text(path):
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError:
            return None

    ports = {}
    for port in sorted(glob.glob(os.path.join(root, "*", "ports", "*"))):
        device = os.path.basename(os.path.dirname(os.path.dirname(port)))
        counters = {}
        for name in IB_COUNTERS:
            raw = text(os.path.join(port, "counters", name))
            if raw is not None and raw.isdigit():
                counters[name] = int(raw)
        ports["%s/%s" % (device, os.path.basename(port))] = {
            "state": text(os.path.join(port, "state")), "phys_state": text(os.path.join(port, "phys_state")),
            "rate": text(os.path.join(port, "rate")), "link_layer": text(os.path.join(port, "link_layer")),
            "counters": counters}
    return ports


def health(spec):
    """The hardware facts ``spec`` asks for: GPUs always; ``xid``, ``dcgm`` and ``ib`` when set."""
    found = {"gpus": gpu_health()}
    if spec.get("xid"):
        found["xid"] = xid_errors()
    if spec.get("dcgm"):
        found["dcgm"] = dcgm_diag()
    if spec.get("ib"):
        found["ib"] = ib_ports()
    return found
