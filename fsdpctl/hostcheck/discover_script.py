"""What ``fsdpctl init`` learns on a node beyond doctor's probe (appended to the probe's source, and
run by it when its argument asks ``init``): the interface and source address that route to the
master, the interface NCCL would pick on its own, NCCL net plugins, and which Python has torch.

Standard library only, Python 3.8-compatible, no tool assumed: the route comes from the kernel
itself through rtnetlink (what ``ip route get`` asks), else from a UDP socket's connect().
"""

import glob
import json
import os
import shutil
import socket
import struct
import subprocess

RTM_GETROUTE, RTM_NEWROUTE, NLMSG_ERROR, NLM_F_REQUEST = 26, 24, 2, 1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PREFSRC = 1, 4, 5, 7
PLUGIN_DIRS = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
               "/usr/local/cuda/lib64", "/opt/amazon/ofi-nccl/lib", "/opt/amazon/efa/lib",
               "/opt/hpcx/nccl_rdma_sharp_plugin/lib")
PYTHON_CANDIDATES = ("python3", "~/.venv/bin/python", "~/venv/bin/python", "~/env/bin/python",
                     "~/miniconda3/bin/python", "~/miniforge3/bin/python", "~/mambaforge/bin/python",
                     "~/anaconda3/bin/python",
                     "/opt/conda/bin/python", "~/miniconda3/envs/*/bin/python", "~/miniforge3/envs/*/bin/python",
                     "~/anaconda3/envs/*/bin/python", "/opt/conda/envs/*/bin/python", "~/*/.venv/bin/python",
                     "~/*/venv/bin/python")


def kernel_route(address):
    """(interface, source address, gateway) the kernel picks for ``address``: one RTM_GETROUTE over
    rtnetlink, so policy routing (``ip rule``) is honoured as it is for real traffic."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        sock.settimeout(2.0)
        body = struct.pack("=BBBBBBBBI", socket.AF_INET, 32, 0, 0, 0, 0, 0, 0, 0)
        body += struct.pack("=HH", 8, RTA_DST) + socket.inet_aton(address)
        sock.send(struct.pack("=IHHII", 16 + len(body), RTM_GETROUTE, NLM_F_REQUEST, 1, 0) + body)
        data = sock.recv(65536)
    finally:
        sock.close()
    length, kind = struct.unpack("=IH", data[:6])
    if kind == NLMSG_ERROR:
        error = -struct.unpack("=i", data[16:20])[0]
        raise OSError(error, os.strerror(error))
    if kind != RTM_NEWROUTE:
        raise OSError("rtnetlink answered message type %d" % kind)
    found, offset = {}, 16 + 12  # nlmsghdr, rtmsg, then the attributes
    while offset + 4 <= min(length, len(data)):
        size, attribute = struct.unpack("=HH", data[offset:offset + 4])
        if size < 4:
            break
        value = data[offset + 4:offset + size]
        if attribute == RTA_OIF:
            found["oif"] = struct.unpack("=I", value[:4])[0]
        elif attribute == RTA_PREFSRC:
            found["src"] = socket.inet_ntoa(value[:4])
        elif attribute == RTA_GATEWAY:
            found["gateway"] = socket.inet_ntoa(value[:4])
        offset += (size + 3) & ~3
    if "oif" not in found:
        raise OSError("no output interface in the route")
    return socket.if_indextoname(found["oif"]), found.get("src"), found.get("gateway")


def holder_of(address, interfaces):
    """The interface holding ``address`` (the master itself), if any."""
    for name, facts in interfaces.items():
        if any((cidr or "").split("/")[0] == address for cidr in facts.get("ipv4") or []):
            return name
    return None


def route(master, interfaces):
    """How this node reaches the master: interface, source address, gateway and how it was learned."""
    if not master:
        return {"error": "no master address given"}
    try:
        master = socket.gethostbyname(master)
    except OSError as exc:
        return {"error": "%s does not resolve here: %s" % (master, exc)}
    name = holder_of(master, interfaces)
    if name is not None:
        return {"interface": name, "source": master, "how": "holds the master's address", "master": master}
    try:
        name, source, gateway = kernel_route(master)
        return {"interface": name, "source": source, "gateway": gateway, "how": "kernel route lookup (rtnetlink)",
                "master": master}
    except (OSError, ValueError, struct.error) as exc:
        why = "rtnetlink: %s" % exc
    try:  # a datagram socket's connect() makes the kernel pick the source address: no packet is sent
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((master, 9))
            source = probe.getsockname()[0]
        finally:
            probe.close()
    except OSError as exc:
        return {"error": "%s; UDP connect: %s" % (why, exc), "master": master}
    return {"interface": holder_of(source, interfaces), "source": source, "how": "UDP connect (%s)" % why,
            "master": master}


def nccl_default(interfaces):
    """The interface NCCL picks without NCCL_SOCKET_IFNAME, in NCCL's own order (src/misc/socket.cc):
    an ``ib*`` one, else any other but ``docker*``, ``lo`` and ``virbr*``, else ``docker*``, then
    ``lo``, then ``virbr*``; each time the first up with an IPv4 address, in the kernel's index order."""
    try:
        order = [name for _, name in sorted(socket.if_nameindex())]
    except OSError:
        order = sorted(interfaces)
    usable = [n for n in order if n in interfaces and interfaces[n].get("up") and interfaces[n].get("ipv4")]
    skipped = ("docker", "lo", "virbr")
    tiers = ([n for n in usable if n.startswith("ib")],
             [n for n in usable if not n.startswith(skipped)],
             [n for n in usable if n.startswith("docker")],
             [n for n in usable if n.startswith("lo")],
             [n for n in usable if n.startswith("virbr")])
    return next((tier[0] for tier in tiers if tier), None)


def net_plugins():
    """NCCL network plugins a rank could load (``libnccl-net*.so``), and NCCL_NET_PLUGIN if set."""
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(PLUGIN_DIRS)
    found = []
    for folder in dirs:
        for path in sorted(glob.glob(os.path.join(folder, "libnccl-net*.so*"))):
            if path not in found:
                found.append(path)
    return {"libraries": found, "env": os.environ.get("NCCL_NET_PLUGIN")}


def python_with_torch(probe_source, given):
    """Each candidate interpreter (the login shell's python3, venvs, conda) with its torch, when the
    one the probe runs with has none; the first with torch is the pick."""
    seen, found = set(), []
    for pattern in PYTHON_CANDIDATES:
        paths = [shutil.which(pattern)] if "/" not in pattern else sorted(glob.glob(os.path.expanduser(pattern)))
        for path in paths:
            if not path or not os.access(path, os.X_OK):
                continue
            real = os.path.realpath(path)
            if path == given or real in seen:
                continue
            seen.add(real)
            try:
                out = subprocess.run([path, "-c", probe_source, json.dumps({"torch_only": True})],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20,
                                     universal_newlines=True).stdout
                facts = json.loads(out[out.rindex(BEGIN) + len(BEGIN):out.rindex(END)])  # noqa: F821 - the probe's
            except (OSError, ValueError, subprocess.SubprocessError):
                continue
            found.append({"path": path, "version": facts["python"]["version"], "torch": facts["torch"]})
            if facts["torch"].get("installed"):
                return found
    return found


CONTAINER_RUNTIMES = ("docker", "podman", "apptainer", "singularity", "enroot")
"""The runtimes ``init`` notes on each host (enroot: what Slurm's Pyxis plugin runs)."""


def container_runtimes():
    """{runtime: its version line} for each container runtime on PATH."""
    import shutil

    found = {}
    for name in CONTAINER_RUNTIMES:
        if shutil.which(name) is None:
            continue
        try:
            out = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found[name] = (out.strip().splitlines() or [""])[0]
    return found


def discover(args, facts):
    """Everything ``init`` asks of this node, given the probe's own facts."""
    spec = args["init"]
    found = {"route": route(spec.get("master"), facts["interfaces"]), "nccl_default": nccl_default(facts["interfaces"]),
             "net_plugins": net_plugins(), "pythons": [], "runtimes": container_runtimes()}
    if not facts["torch"].get("installed") and spec.get("probe_packed"):
        import base64
        import zlib

        source = zlib.decompress(base64.b64decode(spec["probe_packed"])).decode("utf-8")
        found["pythons"] = python_with_torch(source, facts["python"]["path"])
    return found
