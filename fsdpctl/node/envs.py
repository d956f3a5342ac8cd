"""A node's Python environments, made from the launcher's resolution (stdlib only: it runs with the node's
own Python, before any environment exists there).

The launcher runs it as ``python -c <this file> '<json args>'`` and talks to it over stdin and stdout:

1. It prints the node's facts (``FSDPCTL-ENV facts {...}``): its Python, platform, the CUDA its driver
   supports, the uv it has, the environments and wheels it holds, which index hosts it reaches.
2. With ``mode: build`` it reads one request line (the environment's key and wheels, which wheels follow
   on stdin, whether the node downloads the rest itself), then the wheels' bytes, and makes the
   environment. It prints ``FSDPCTL-ENV done {...}`` or ``FSDPCTL-ENV error {...}``.

Layout under ``root``:

- ``wheels/``: every wheel received, checked against its sha256 before it is moved into place;
- ``tools/uv-<version>/uv``: the uv binary, taken out of its wheel;
- ``<key>/``: a whole environment (a relocatable venv), ``.fsdpctl-env.json`` marking it ready;
- ``<name>``: a link to the key the profile's environment has on this node (the ranks' python lives
  under it, so one path serves every node whatever its platform);
- ``.build-<key>-<pid>/``: one being made, moved to ``<key>`` only when whole;
- ``<key>.lock``: held while one launch makes the environment (another waits on it).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
import zipfile

TAG = "FSDPCTL-ENV"
READY = ".fsdpctl-env.json"
USED = ".fsdpctl-used"
CHUNK = 1 << 20


def say(kind: str, body: dict) -> None:
    sys.stdout.write(f"{TAG} {kind} {json.dumps(body, sort_keys=True)}\n")
    sys.stdout.flush()


def glibc() -> str | None:
    name, version = platform.libc_ver()
    return version if name == "glibc" and version else None


def cuda_driver() -> int | None:
    """The CUDA version the driver supports (12080 for 12.8), from libcuda itself; None without one."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
            return version.value
    except (OSError, AttributeError):
        pass
    return None


def reaches(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def uv_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[1] if len(out) >= 2 and out[0] == "uv" else None


def own_uv(root: str) -> dict | None:
    """The newest uv this root holds (``tools/uv-<version>/uv``), else one on PATH."""
    tools = os.path.join(root, "tools")
    found = []
    for entry in os.listdir(tools) if os.path.isdir(tools) else ():
        path = os.path.join(tools, entry, "uv")
        if entry.startswith("uv-") and os.access(path, os.X_OK):
            found.append((entry[3:], path))
    for version, path in sorted(found, key=lambda item: [int(p) if p.isdigit() else 0 for p in item[0].split(".")],
                                reverse=True):
        return {"path": path, "version": version}
    on_path = shutil.which("uv")
    if on_path:
        version = uv_version(on_path)
        if version:
            return {"path": on_path, "version": version}
    return None


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


def facts(args: dict) -> dict:
    root = os.path.expanduser(args["root"])
    wheels = os.path.join(root, "wheels")
    try:
        usage = shutil.disk_usage(root if os.path.isdir(root) else os.path.dirname(root.rstrip("/")) or "/")
        free = usage.free
    except OSError:
        free = None
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "executable": os.path.realpath(sys.executable),
        "machine": platform.machine(),
        "glibc": glibc(),
        "cuda_driver": cuda_driver(),
        "uv": own_uv(root),
        "wheels": sorted(os.listdir(wheels)) if os.path.isdir(wheels) else [],
        "free_bytes": free,
        "root": root,
        **environments(root),
        "reaches": {host: reaches(host) for host in args.get("index_hosts", [])},
    }


def read_exactly(stream, count: int) -> bytes:
    parts, left = [], count
    while left:
        part = stream.read(min(left, CHUNK))
        if not part:
            raise EOFError(f"the launcher's stream ended {left} bytes short")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def receive(stream, folder: str, wheel: dict, mode: int = 0o644) -> None:
    """One file's bytes (a wheel's), checked against its sha256, then moved into place whole."""
    os.makedirs(folder, exist_ok=True)
    final = os.path.join(folder, wheel["file"])
    part = os.path.join(folder, f".{wheel['file']}.{os.getpid()}.part")
    digest, left = hashlib.sha256(), wheel["size"]
    try:
        with open(part, "wb") as handle:
            while left:
                chunk = stream.read(min(left, CHUNK))
                if not chunk:
                    raise EOFError(f"{wheel['file']}: the launcher's stream ended {left} bytes short")
                digest.update(chunk)
                handle.write(chunk)
                left -= len(chunk)
        if digest.hexdigest() != wheel["sha256"]:
            raise ValueError(f"{wheel['file']}: its sha256 differs from the launcher's (damaged on the way)")
        os.chmod(part, mode)
        os.replace(part, final)
    finally:
        if os.path.exists(part):
            os.unlink(part)


def install_uv(root: str, wheel: dict) -> str:
    """The uv binary out of its wheel, into ``tools/uv-<version>/`` (whole before it is there)."""
    folder = os.path.join(root, "tools", f"uv-{wheel['version']}")
    final = os.path.join(folder, "uv")
    if os.access(final, os.X_OK):
        return final
    os.makedirs(folder, exist_ok=True)
    with zipfile.ZipFile(os.path.join(root, "wheels", wheel["file"])) as archive:
        member = next(n for n in archive.namelist() if n.endswith(".data/scripts/uv"))
        part = f"{final}.{os.getpid()}.part"
        with archive.open(member) as source, open(part, "wb") as target:
            shutil.copyfileobj(source, target)
    os.chmod(part, 0o755)  # noqa: S103 - a program: everyone who runs the environment runs it
    os.replace(part, final)
    return final


def requirement_lines(root: str, request: dict) -> str:
    """The environment's packages as direct references with their hashes: sent wheels by their path
    here, the others by their index URL (a node that downloads them itself)."""
    lines = []
    for wheel in request["wheels"]:
        local = os.path.join(root, "wheels", wheel["file"])
        url = "file://" + local if os.path.exists(local) else wheel["url"]
        lines.append(f"{wheel['name']} @ {url} --hash=sha256:{wheel['sha256']}")
    return "\n".join(lines) + "\n"


def build(root: str, request: dict, uv: str | None, base: str) -> dict:
    """Make the environment ``key`` unless it is whole already; another launch making it is waited for."""
    key = request["key"]
    os.makedirs(root, exist_ok=True)
    started = time.monotonic()
    with open(os.path.join(root, f"{key}.lock"), "a") as lock:
        waited = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        waited = time.monotonic() - waited
        if read_ready(root, key) is not None:
            return {"built": False, "waited": round(waited, 3), "seconds": round(time.monotonic() - started, 3)}
        if uv is None:
            raise RuntimeError("this node has no uv and none was sent")
        building = os.path.join(root, f".build-{key}-{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        env = {**os.environ, "UV_CACHE_DIR": os.path.join(root, "cache"), "UV_PYTHON_DOWNLOADS": "never",
               "UV_NO_CONFIG": "1", "UV_NO_PROGRESS": "1"}
        env.pop("VIRTUAL_ENV", None)
        try:
            run([uv, "venv", "--quiet", "--relocatable", "--python", base, building], env)
            requirements = os.path.join(building, "fsdpctl-requirements.txt")
            with open(requirements, "w", encoding="utf-8") as handle:
                handle.write(requirement_lines(root, request))
            offline = all(os.path.exists(os.path.join(root, "wheels", w["file"])) for w in request["wheels"])
            run([uv, "pip", "sync", "--quiet", "--python", os.path.join(building, "bin", "python"),
                 "--require-hashes", *(["--offline"] if offline else []), requirements], env)
            record = {"key": key, "name": request["name"], "created": time.time(), "python": platform.python_version(),
                      "base": base, "packages": {w["name"]: w["version"] for w in request["wheels"]},
                      "wheels": [w["file"] for w in request["wheels"]], "offline": offline,
                      "source": request.get("source", "")}
            with open(os.path.join(building, READY), "w", encoding="utf-8") as handle:
                json.dump(record, handle, sort_keys=True)
            os.replace(building, os.path.join(root, key))
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return {"built": True, "waited": round(waited, 3), "seconds": round(time.monotonic() - started, 3),
            "offline": offline}


def run(argv: list[str], env: dict) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split()) or f"exit {done.returncode}"
        raise RuntimeError(f"{os.path.basename(argv[0])} {argv[1]}: {said}")


def point(root: str, name: str, key: str) -> None:
    """``<root>/<name>`` -> ``<key>``, replaced in one step (a run starting now sees one or the other)."""
    link = os.path.join(root, name)
    if os.path.islink(link) and os.readlink(link) == key:
        return
    temporary = f"{link}.{os.getpid()}.new"
    os.symlink(key, temporary)
    os.replace(temporary, link)


def in_use(root: str) -> set[str]:
    """Keys some process runs from now (a Python started from the environment, by its key or a name)."""
    names = {name: key for name, key in environments(root)["names"].items()}
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


def main() -> int:
    args = json.loads(sys.argv[1])
    root = os.path.expanduser(args["root"])
    mode = args.get("mode", "facts")
    try:
        if mode == "prune":
            os.makedirs(root, exist_ok=True)
            say("done", {"removed": prune(root, int(args["keep"]), set(args.get("protect", [])))})
            return 0
        found = facts(args)
        if mode == "list":
            found["sizes"] = sizes(root, list(found["ready"]))
        say("facts", found)
        if mode != "build":
            return 0
        stdin = sys.stdin.buffer
        request = json.loads(stdin.readline().decode("utf-8"))
        if request.get("skip"):
            return 0
        os.makedirs(root, exist_ok=True)
        uv = (found["uv"] or {}).get("path")
        binary = request.get("uv_binary")
        if binary:  # the launcher's own uv, this node being of its kind
            folder = os.path.join(root, "tools", f"uv-{binary['version']}")
            receive(stdin, folder, {**binary, "file": "uv"}, mode=0o755)
            uv = os.path.join(folder, "uv")
        for wheel in request["send"]:
            receive(stdin, os.path.join(root, "wheels"), wheel)
        if request.get("uv_wheel"):
            uv = install_uv(root, request["uv_wheel"])
        result = build(root, request, uv, args["base"])
        key = request["key"]
        point(root, request["name"], key)
        with open(os.path.join(root, key, USED), "w"):
            pass
        result["removed"] = prune(root, int(request.get("keep", 3)), {key})
        say("done", result)
        return 0
    except Exception as exc:  # one line for the launcher, whatever went wrong here
        if isinstance(exc, OSError) and exc.errno == 28:
            message = f"the disk under {root} is full (nothing half-made was kept)"
        else:
            message = f"{type(exc).__name__}: {exc}"
        say("error", {"message": message})
        return 1


if __name__ == "__main__":
    sys.exit(main())
