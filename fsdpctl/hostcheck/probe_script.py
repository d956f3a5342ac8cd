"""The probe that runs on every node (sent as ``python -c``): collects facts, prints JSON between sentinels.

Standard library only, Python 3.8-compatible: it runs with whatever interpreter the profile names on
the node, before anything of fsdpctl is installed there. It must stay fast: it reads torch's and
NCCL's versions from installed files (``import torch`` costs ~1.5 s); ``deep`` imports it.
Argument (argv[1], JSON): workdir, interface, deep, and optionally ``listen`` (on the master: hold the
rendezvous port open until the other nodes connected) or ``connect`` (on the others: connect to the
master's port), both bounded by a window in seconds; ``health``: the hardware (``node/health_probe``).
"""

import glob
import json
import os
import platform
import re
import socket
import struct
import subprocess
import sys
import time

BEGIN = "<<<FSDPCTL-PROBE-BEGIN>>>"
END = "<<<FSDPCTL-PROBE-END>>>"


def read(path, limit=65536):
    try:
        with open(path, "rb") as handle:
            return handle.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def os_name():
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', read("/etc/os-release") or "", re.M)
    return match.group(1) if match else platform.system()


def torch_facts():
    import importlib.util

    facts = {"installed": False}
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return facts
    root = os.path.dirname(spec.origin)
    text = read(os.path.join(root, "version.py")) or ""
    facts["installed"] = True
    facts["path"] = root
    for key, name in (("version", "__version__"), ("cuda", "cuda"), ("hip", "hip"), ("git", "git_version")):
        match = re.search(r"^%s\s*(?::[^=]*)?=\s*'([^']*)'" % name, text, re.M)
        facts[key] = match.group(1) if match else None
    init = read(os.path.join(root, "distributed", "fsdp", "__init__.py")) or ""
    facts["fsdp2_exported"] = "fully_shard" in init
    facts["cuda_build"] = bool(glob.glob(os.path.join(root, "lib", "libtorch_cuda*.so*")))
    facts["nccl"] = nccl_version(root)
    return facts


def nccl_version(torch_root):
    """NCCL shipped with torch: the nvidia-nccl wheel's version, else its header, else a library name."""
    try:
        from importlib import metadata
    except ImportError:
        metadata = None
    if metadata is not None:
        for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
            try:
                return {"version": metadata.version(dist), "source": dist}
            except Exception:
                pass
    site = os.path.dirname(torch_root)
    header = read(os.path.join(site, "nvidia", "nccl", "include", "nccl.h")) or ""
    parts = [re.search(r"#define NCCL_%s\s+(\d+)" % k, header) for k in ("MAJOR", "MINOR", "PATCH")]
    if all(parts):
        return {"version": ".".join(p.group(1) for p in parts), "source": "nccl.h"}
    for folder in (os.path.join(torch_root, "lib"), os.path.join(sys.prefix, "lib")):
        for lib in sorted(glob.glob(os.path.join(folder, "libnccl.so.*.*.*"))):
            return {"version": lib.split("libnccl.so.")[1], "source": lib}
    return None


def deep_torch():
    started = time.time()
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:
        return {"import_error": "%s: %s" % (type(exc).__name__, exc)}
    facts = {"version": torch.__version__, "cuda": torch.version.cuda,
             "cuda_available": False, "device_count": 0,
             "gloo": dist.is_available() and dist.is_gloo_available(),
             "nccl_available": dist.is_available() and dist.is_nccl_available()}
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401

        facts["fsdp2_import"] = True
    except Exception as exc:
        facts["fsdp2_import"] = False
        facts["fsdp2_error"] = str(exc)
    try:
        facts["cuda_available"] = torch.cuda.is_available()
        facts["device_count"] = torch.cuda.device_count()
        if facts["cuda_available"]:
            facts["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
            facts["device_names"] = [torch.cuda.get_device_name(i) for i in range(facts["device_count"])]
    except Exception as exc:
        facts["cuda_error"] = str(exc)
    facts["import_seconds"] = round(time.time() - started, 3)
    return facts


def gpus():
    facts = {"count": 0, "names": [], "driver": None, "source": None}
    version = read("/proc/driver/nvidia/version") or ""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9.]+)", version)
    if match:
        facts["driver"] = match.group(1)
    listed = glob.glob("/proc/driver/nvidia/gpus/*")
    if listed:
        facts["count"], facts["source"] = len(listed), "/proc/driver/nvidia/gpus"
    else:  # containers often lack /proc/driver/nvidia but always get the device files
        devices = [d for d in glob.glob("/dev/nvidia*") if re.match(r"^/dev/nvidia\d+$", d)]
        if devices:
            facts["count"], facts["source"] = len(devices), "/dev"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10,
                             universal_newlines=True)
        rows = [r.split(",") for r in out.stdout.strip().splitlines() if r.strip()]
        if out.returncode == 0 and rows:
            facts["names"] = [r[0].strip() for r in rows]
            facts["driver"] = rows[0][1].strip() if len(rows[0]) > 1 else None
            facts["memory_mib"] = [int(float(r[2])) if r[2:] and r[2].strip().isdigit() else None for r in rows]
            facts["count"], facts["source"] = len(rows), "nvidia-smi"
    except (OSError, subprocess.SubprocessError):
        pass
    return facts


# Linux ioctls on an AF_INET socket, each taking a struct ifreq (16-byte name, then a union).
SIOCGIFFLAGS, SIOCGIFADDR, SIOCGIFNETMASK, SIOCGIFMTU = 0x8913, 0x8915, 0x891B, 0x8921
IFF_UP = 0x1


def ip_command_addresses():
    """{interface: [cidr, ...]} from `ip -j -4 addr` (every address, secondaries too); None when
    iproute2 is missing or says nothing usable."""
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=5, universal_newlines=True)
        entries = json.loads(out.stdout or "null")
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not isinstance(entries, list):
        return None
    found = {}
    for entry in entries:
        found[entry.get("ifname")] = ["%s/%s" % (a["local"], a["prefixlen"]) for a in entry.get("addr_info", [])
                                      if a.get("family") == "inet"]
    return found


def _ifreq(sock, request, name):
    import fcntl

    return fcntl.ioctl(sock.fileno(), request, struct.pack("256s", name.encode()[:15]))


def ioctl_facts(name):
    """What the kernel says of one interface through ioctls (no tool needed): its primary IPv4
    address with prefix length ([] when it has none), flags and MTU; a key is None when the
    kernel could not be asked, with the reason in ``error``."""
    import errno

    facts = {"ipv4": None, "flags": None, "mtu": None}
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:
        facts["error"] = "no AF_INET socket: %s" % (exc.strerror or exc)
        return facts
    try:
        facts["flags"] = struct.unpack("H", _ifreq(sock, SIOCGIFFLAGS, name)[16:18])[0]
        facts["mtu"] = struct.unpack("i", _ifreq(sock, SIOCGIFMTU, name)[16:20])[0]
        try:
            address = socket.inet_ntoa(_ifreq(sock, SIOCGIFADDR, name)[20:24])
            mask = struct.unpack("!I", _ifreq(sock, SIOCGIFNETMASK, name)[20:24])[0]
            facts["ipv4"] = ["%s/%d" % (address, bin(mask).count("1"))]
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:  # EADDRNOTAVAIL: the interface has no IPv4 address
                raise
            facts["ipv4"] = []
    except (OSError, ImportError) as exc:
        facts["error"] = "ioctl failed: %s" % (getattr(exc, "strerror", None) or exc)
    finally:
        sock.close()
    return facts


def interface_names():
    """Interface names from sysfs, else from the kernel's own index (sysfs may be missing in a container)."""
    names = [os.path.basename(p) for p in sorted(glob.glob("/sys/class/net/*"))]
    if names:
        return names
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def interfaces():
    """Each interface's state, whether it is up, its MTU and IPv4 addresses. iproute2 gives every
    address when it is installed; otherwise ioctls give the primary one. A fact that cannot be read
    at all is None, with the reason in ``unknown``."""
    listed = ip_command_addresses()
    result = {}
    for name in interface_names():
        path = os.path.join("/sys/class/net", name)
        kernel = ioctl_facts(name)
        flags_text, state = read(os.path.join(path, "flags")), read(os.path.join(path, "operstate"))
        mtu_text = read(os.path.join(path, "mtu"))
        flags = int(flags_text.strip() or "0", 16) if flags_text is not None else kernel["flags"]
        state = state.strip() if state is not None else None
        entry = {
            "state": state or "unknown",
            # IFF_UP set and not known to be down (loopback and some virtual links say "unknown")
            "up": None if flags is None else bool(flags & IFF_UP) and (state or "unknown") in ("up", "unknown"),
            "mtu": int(mtu_text.strip() or 0) if mtu_text is not None else kernel["mtu"],
            "ipv4": listed.get(name, []) if listed is not None else kernel["ipv4"],
            "ipv4_source": "ip" if listed is not None else "ioctl",
        }
        if kernel.get("error") and None in (entry["up"], entry["mtu"], entry["ipv4"]):
            entry["unknown"] = kernel["error"]
        result[name] = entry
    return result


def infiniband():
    devices = {}
    for dev in sorted(glob.glob("/sys/class/infiniband/*")):
        ports = {}
        for port in sorted(glob.glob(os.path.join(dev, "ports", "*"))):
            ports[os.path.basename(port)] = {
                "state": (read(os.path.join(port, "state")) or "").strip(),
                "rate": (read(os.path.join(port, "rate")) or "").strip(),
                "link_layer": (read(os.path.join(port, "link_layer")) or "").strip(),
            }
        devices[os.path.basename(dev)] = ports
    return devices


def space(path):
    path = os.path.expanduser(path or "~")
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        stat = os.statvfs(path or "/")
    except OSError:
        return None
    return {"path": path, "free_bytes": stat.f_bavail * stat.f_frsize, "total_bytes": stat.f_blocks * stat.f_frsize}


def packages(names):
    """{distribution: installed version, or None} for this Python, from the installed metadata."""
    from importlib import metadata

    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except Exception:
            found[name] = None
    return found


def tools():
    """Where the node's optional tools are (None: not on PATH). None of them is needed: each fact
    they give has another source, so a missing one never fails a check."""
    import shutil

    return {name: shutil.which(name) for name in ("ip", "nvidia-smi", "ibstat", "py-spy")}


def stack_tools():
    """What ``fsdpctl stacks`` can use here: py-spy (next to this Python, or on PATH) and whether the
    kernel lets it attach (Yama's ptrace_scope: 1 allows only root or a parent, 2 root, 3 nobody)."""
    import shutil

    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    scope = (read("/proc/sys/kernel/yama/ptrace_scope") or "").strip()
    return {"py_spy": beside if os.access(beside, os.X_OK) else shutil.which("py-spy"),
            "ptrace_scope": int(scope) if scope.isdigit() else None, "root": os.geteuid() == 0}


def libc_version():
    """``2.36`` on glibc, None elsewhere (musl)."""
    try:
        name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")
    except (ValueError, OSError, AttributeError):
        return None
    return version if name == "glibc" else None


def collect(args):
    """Every fact about this node that ``args`` asks for."""
    started = time.time()
    # The rendezvous port first, beside the rest: PortCheck comes with this source (port_probe.py).
    ports = PortCheck(args) if args.get("listen") or args.get("connect") else None  # noqa: F821
    facts = {
        "hostname": socket.gethostname(),
        "os": os_name(),
        "kernel": platform.release(),
        "python": {"path": sys.executable, "version": platform.python_version()},
        "platform": {"machine": platform.machine(), "glibc": libc_version(),
                     "implementation": sys.implementation.name, "executable": os.path.realpath(sys.executable)},
        "torch": torch_facts(),
        "gpus": gpus(),
        "interfaces": interfaces(),
        "infiniband": infiniband(),
        "nccl_conf": read("/etc/nccl.conf"),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
        "shm": space("/dev/shm"),
        "disk": space(args.get("workdir")),
        "clock": time.time(),
        "tools": tools(),
        "stacks": stack_tools(),
    }
    if args.get("packages"):
        facts["packages"] = packages(args["packages"])
    if args.get("deep"):
        facts["deep"] = deep_torch()
    if args.get("init"):  # discover() comes with this source (discover_script.py)
        facts["init"] = discover(args, facts)  # noqa: F821
    if args.get("health"):  # health() comes with this source (node/health_probe.py)
        facts["health"] = health(args["health"])  # noqa: F821
    if args.get("container"):
        container_into(facts, args)  # noqa: F821 - comes with this source (container/probe_part.py)
    if args.get("shared_file"):  # written by the submitting machine: is this node's view the same?
        facts["shared_file"] = os.path.isfile(os.path.expanduser(args["shared_file"]))
    if ports is not None:
        facts.update(ports.finish())
    facts["probe_seconds"] = round(time.time() - started, 3)
    return facts


def answer(facts):
    """Print the facts between the sentinels the launcher looks for."""
    sys.stdout.write("\n%s\n%s\n%s\n" % (BEGIN, json.dumps(facts), END))
    sys.stdout.flush()


def main():
    args = {}
    for given in sys.argv[1:]:  # later objects add to the first (Slurm: what all nodes ask, then this node's part)
        args.update(json.loads(given))
    answer({"python": {"path": sys.executable, "version": platform.python_version()}, "torch": torch_facts()}
           if args.get("torch_only") else collect(args))  # torch_only: init asks another Python for its torch


if __name__ == "__main__":
    main()
