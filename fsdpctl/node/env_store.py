"""A node's environment store (stdlib only): which environments are whole, which a process runs from,
removing the ones past ``keep``, their sizes, and whether the store is on shared storage. Sent ahead of
``envs``'s own source when the launcher runs it with ``python -c``; imported by it as a module."""

from __future__ import annotations

import fcntl
import json
import os
import shutil

READY = ".fsdpctl-env.json"
USED = ".fsdpctl-used"

NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "fuse.glusterfs", "glusterfs",
                        "panfs", "wekafs", "cifs", "smb3", "9p", "fuse.juicefs", "virtiofs")


def read_ready(root: str, key: str) -> dict | None:
    try:
        with open(os.path.join(root, key, READY), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def environments(root: str) -> dict:
    """Every whole environment under ``root`` by key (its record, its size is left to ``list``), and
    which key each name points at."""
    ready, names = {}, {}
    for entry in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        path = os.path.join(root, entry)
        if os.path.islink(path):
            names[entry] = os.readlink(path)
        elif os.path.isdir(path) and not entry.startswith("."):
            record = read_ready(root, entry)
            if record is not None:
                used = os.path.join(path, USED)
                record["used"] = os.path.getmtime(used) if os.path.exists(used) else record.get("created", 0)
                ready[entry] = record
    return {"ready": ready, "names": names}


def point(root: str, name: str, key: str) -> None:
    """``<root>/<name>`` -> ``<key>``, replaced in one step (a run starting now sees one or the other)."""
    link = os.path.join(root, name)
    if os.path.islink(link) and os.readlink(link) == key:
        return
    temporary = f"{link}.{os.getpid()}.new"
    os.symlink(key, temporary)
    os.replace(temporary, link)


def settle(root: str, request: dict, built: bool) -> list[str]:
    """The environment ``request`` names, whole now: its name pointed at it, marked used, and, when it
    is new, the ones past ``keep`` removed (a reused one leaves the rest as they are)."""
    key = request["key"]
    point(root, request["name"], key)
    with open(os.path.join(root, key, USED), "w"):
        pass
    return prune(root, int(request.get("keep", 3)), {key}) if built else []


def in_use(root: str) -> set[str]:
    """Keys some process runs from now (a Python started from the environment, by its key or a name)."""
    names = environments(root)["names"]
    used = set()
    prefix = root.rstrip("/") + "/"
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                first = handle.read().split(b"\0", 1)[0].decode("utf-8", "replace")
        except OSError:
            continue
        if first.startswith(prefix):
            entry = first[len(prefix):].split("/", 1)[0]
            used.add(names.get(entry, entry))
    return used


def prune(root: str, keep: int, protect: set[str]) -> list[str]:
    """Remove whole environments past the ``keep`` used most recently (never one in use or protected),
    their names' links, and the wheels no environment left needs."""
    leftovers(root)
    state = environments(root)
    ready = state["ready"]
    busy = in_use(root) | protect
    order = sorted(ready, key=lambda k: ready[k]["used"], reverse=True)
    removed = [key for index, key in enumerate(order) if index >= keep and key not in busy]
    for key in removed:
        with open(os.path.join(root, f"{key}.lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # being made again right now
            aside = os.path.join(root, f".remove-{key}-{os.getpid()}")
            os.replace(os.path.join(root, key), aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.unlink(os.path.join(root, f"{key}.lock"))
        for name, target in state["names"].items():
            if target == key:
                os.unlink(os.path.join(root, name))
    if removed:
        needed = {w for key, record in ready.items() if key not in removed for w in record.get("wheels", [])}
        folder = os.path.join(root, "wheels")
        for wheel in os.listdir(folder) if os.path.isdir(folder) else ():
            if wheel not in needed and not wheel.startswith("uv-") and not wheel.startswith("."):
                os.unlink(os.path.join(folder, wheel))
    return removed


def leftovers(root: str) -> None:
    """What a killed build or removal left aside (its process is gone): removed."""
    for entry in os.listdir(root):
        if entry.startswith((".build-", ".remove-")):
            pid = entry.rsplit("-", 1)[-1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(os.path.join(root, entry), ignore_errors=True)


def sizes(root: str, keys: list[str]) -> dict:
    """Bytes on disk per environment, a file linked from several counted once overall (uv links from its cache)."""
    seen, out = set(), {}
    for key in keys:
        total = 0
        for folder, _, files in os.walk(os.path.join(root, key)):
            for name in files:
                try:
                    stat = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue
                if (stat.st_dev, stat.st_ino) not in seen:
                    seen.add((stat.st_dev, stat.st_ino))
                    total += stat.st_blocks * 512
        out[key] = total
    return out


def shared_storage(path: str) -> str | None:
    """The network file system ``path`` lies on (the longest mount point above it), else None."""
    best, kind = "", None
    try:
        with open("/proc/mounts", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 3 and (path == fields[1] or path.startswith(fields[1].rstrip("/") + "/")) \
                        and len(fields[1]) >= len(best):
                    best, kind = fields[1], fields[2]
    except OSError:
        return None
    return kind if kind in NETWORK_FILE_SYSTEMS else None


