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
if __package__:  # a Slurm job's step runs this as a module; the launcher sends the store's source ahead of it
    from .env_store import READY, environments, prune, read_ready, settle, shared_storage, sizes
CHUNK = 1 << 20


def say(kind: str, body: dict) -> None:
    sys.stdout.write(f"{TAG} {kind} {json.dumps(body, sort_keys=True)}\n")
    sys.stdout.flush()


def glibc() -> str | None:
    try:
        name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        return None
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


def facts(args: dict) -> dict:
    root = os.path.expanduser(args["root"])
    wheels = os.path.join(root, "wheels")
    return {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "executable": os.path.realpath(sys.executable),
        "machine": platform.machine(),
        "glibc": glibc(),
        "cuda_driver": cuda_driver(),
        "uv": own_uv(root),
        "wheels": sorted(os.listdir(wheels)) if os.path.isdir(wheels) else [],
        "root": root,
        **environments(root),
        "reaches": {host: reaches(host) for host in args.get("index_hosts", [])},
    }


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


def install_uv(root: str, wheels: str, wheel: dict) -> str:
    """The uv binary out of its wheel (in the folder ``wheels``), into ``tools/uv-<version>/``, whole
    before it is there."""
    folder = os.path.join(root, "tools", f"uv-{wheel['version']}")
    final = os.path.join(folder, "uv")
    if os.access(final, os.X_OK):
        return final
    os.makedirs(folder, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheels, wheel["file"])) as archive:
        member = next(n for n in archive.namelist() if n.endswith(".data/scripts/uv"))
        part = f"{final}.{os.getpid()}.part"
        with archive.open(member) as source, open(part, "wb") as target:
            shutil.copyfileobj(source, target)
    os.chmod(part, 0o755)  # noqa: S103 - a program: everyone who runs the environment runs it
    os.replace(part, final)
    return final


def local_wheel(folders: list[str], wheel: dict) -> str | None:
    for folder in folders:
        path = os.path.join(folder, wheel["file"])
        if os.path.exists(path):
            return path
    return None


def requirement_lines(folders: list[str], request: dict) -> str:
    """The environment's packages as direct references with their hashes: wheels here by their path,
    the others by their index URL (a node that downloads them itself)."""
    lines = []
    for wheel in request["wheels"]:
        local = local_wheel(folders, wheel)
        url = "file://" + local if local else wheel["url"]
        lines.append(f"{wheel['name']} @ {url} --hash=sha256:{wheel['sha256']}")
    return "\n".join(lines) + "\n"


def build(root: str, request: dict, uv: str | None, base: str, folders: list[str] | None = None) -> dict:
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
            folders = [os.path.join(root, "wheels"), *(folders or [])]
            with open(requirements, "w", encoding="utf-8") as handle:
                handle.write(requirement_lines(folders, request))
            offline = all(local_wheel(folders, w) for w in request["wheels"])
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


def staged(args: dict, root: str) -> int:
    """A Slurm job's first step, on every allocated node: the environment from what the launcher put in
    the run directory. On shared storage node 0 makes it and the others wait for it; elsewhere each
    node makes its own (or finds it made)."""
    folder = os.path.expanduser(args["staged"])
    with open(os.path.join(folder, "request.json"), encoding="utf-8") as handle:
        request = json.load(handle)
    node, key = os.environ.get("SLURM_NODEID", "0"), request["key"]
    os.makedirs(root, exist_ok=True)
    shared = shared_storage(os.path.realpath(root))
    started = time.monotonic()
    if shared and node != "0":
        deadline = time.monotonic() + float(args.get("wait", 3600))
        while read_ready(root, key) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"node 0 did not make environment {key} on the shared {root} in time")
            time.sleep(1.0)
        print(f"fsdpctl: node {node}: environment {key} made by node 0 on shared storage ({shared}), "
              f"waited {time.monotonic() - started:.1f} s", flush=True)
        return 0
    uv = (own_uv(root) or {}).get("path")
    if request.get("uv_binary"):
        uv = os.path.join(folder, "uv")
    elif request.get("uv_wheel") and not uv:
        uv = install_uv(root, os.path.join(folder, "wheels"), request["uv_wheel"])
    result = build(root, request, uv, args["base"], [os.path.join(folder, "wheels")])
    removed = settle(root, request, result["built"])
    where = f"on shared storage ({shared})" if shared else "on this node"
    said = "made" if result["built"] else "made by another node's step meanwhile" if result["waited"] > 0.5 \
        else "reused"
    print(f"fsdpctl: node {node}: environment {key} {said} {where} in {time.monotonic() - started:.1f} s"
          + (f"; removed {', '.join(removed)}" if removed else ""), flush=True)
    return 0


def main() -> int:
    args = json.loads(sys.argv[1])
    root = os.path.expanduser(args["root"])
    mode = args.get("mode", "facts")
    try:
        if mode == "staged":
            return staged(args, root)
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
            uv = install_uv(root, os.path.join(root, "wheels"), request["uv_wheel"])
        result = build(root, request, uv, args["base"])
        result["removed"] = settle(root, request, result["built"])
        say("done", result)
        return 0
    except Exception as exc:  # one line for the launcher, whatever went wrong here
        if isinstance(exc, OSError) and exc.errno == 28:
            message = f"the disk under {root} is full (nothing half-made was kept)"
        else:
            message = f"{type(exc).__name__}: {exc}"
        if mode == "staged":  # a job's step: its output is the job's, read by a person
            node = os.environ.get("SLURM_NODEID", "0")
            print(f"fsdpctl: node {node}: the environment could not be made: {message}", file=sys.stderr, flush=True)
        else:
            say("error", {"message": message})
        return 1


if __name__ == "__main__":
    sys.exit(main())
