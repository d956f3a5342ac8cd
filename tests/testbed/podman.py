"""Podman on the testbed: image stores of their own, cgroups for namespace hosts (the test image itself,
built once and cached, is ``podman_image``'s).

* ``Store`` is one Podman storage and configuration in a folder of its own (nothing touches the machine's
  default store, its ``/dev/shm`` lock segment or its network configuration). A fake host uses it through
  ``Store.sshd_setenv()`` in its sshd_config; several hosts may share one store (one image load).
* ``cgroup_setup()`` / ``CGROUP_SETUP`` is the shell a namespace host runs before its sshd starts
  (``Lab.start_sshd(..., setup=...)``): ``ip netns exec`` mounts a fresh ``/sys``, so runc would find no
  cgroups there.
* ``no_podman_path()`` gives a PATH without podman, for a host that lacks it.

Everything is configured for this kind of machine: runc with ``cgroup_manager = "cgroupfs"`` (crun refuses
hybrid cgroups), ``default_ulimits`` no higher than the host's (no CAP_SYS_RESOURCE here; never pass
``--ulimit``: one flag replaces all the defaults and fails with "error setting rlimit type 7").
sshd honours only the first ``SetEnv`` line of its configuration: give a host every variable in the one
line ``Store.sshd_setenv(extra)`` writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

IMAGE = "localhost/fsdpctl-test:2.13.0"
IMAGE_PYTHON = "/opt/venv/bin/python"

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNROOT_BASE = Path("/run/fsdpctl-podman")  # every store's runroot: see Store.runroot

_TOOLS = ("podman", "runc", "conmon", "mmdebstrap")
_NOT_PODMAN = frozenset({"podman", "podman-remote", "docker"})
_TAIL = 4000


def _tail(text: str | bytes | None, size: int = _TAIL) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    text = (text or "").strip()
    return text if len(text) <= size else "..." + text[-size:]


class PodmanError(subprocess.CalledProcessError):
    """A podman command failed; its message carries the command and the tail of its stderr."""

    def __str__(self) -> str:
        return (f"{shlex.join(str(a) for a in self.cmd)} exited {self.returncode}: "
                f"{_tail(self.stderr) or _tail(self.stdout)}")


# ---- availability ------------------------------------------------------------------------------------
def podman_available() -> str | None:
    """None when Podman containers can run here (root, podman, runc, conmon, mmdebstrap, a working store),
    else the reason they cannot, as a sentence."""
    if os.geteuid() != 0:
        return "Podman on the testbed needs root (rootful containers in namespace hosts)."
    missing = [t for t in _TOOLS if not shutil.which(t) and not Path("/usr/sbin", t).exists()]
    if missing:
        return (f"Podman on the testbed needs {', '.join(missing)} "
                "(apt-get install podman runc uidmap mmdebstrap).")
    if not cgroup_setup():
        return "Podman on the testbed needs cgroups mounted under /sys/fs/cgroup."
    folder = Path(tempfile.mkdtemp(prefix="fsdpctl-podman-probe-", dir="/var/tmp"))
    try:
        store = Store(folder)
        info = store.podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False, timeout=60)
        if info.returncode != 0:
            return f"podman does not work here: {_tail(info.stderr, 500)}"
    except (OSError, subprocess.SubprocessError) as error:
        return f"podman does not work here: {error}"
    finally:
        Store(folder, create=False).destroy()
    return None


# ---- one store ---------------------------------------------------------------------------------------
def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


class Store:
    """One Podman storage and configuration in ``folder``: ``root`` (graphroot), ``tmp`` (the engine's
    tmp_dir: its locks, events log, exit files), ``networks``, ``containers.conf`` and ``storage.conf``;
    the runroot is ``/run/fsdpctl-podman/<hash of folder>`` (it must be short: see ``runroot``). Locks
    are files under ``tmp`` (not the machine's ``/dev/shm/libpod_lock``, which a new store's first
    command would otherwise reset for every store); networks live in ``networks``.

    Give a host this store with ``Store.sshd_setenv()`` in its sshd_config; run podman here with
    ``Store.podman()``. ``destroy()`` removes every container, unmounts and deletes the folder and the
    runroot."""

    def __init__(self, folder: Path, *, create: bool = True) -> None:
        """``folder`` must be the store's own (``destroy()`` deletes it); ``create=False`` only names an
        existing store (to destroy one left behind)."""
        self.folder = Path(folder).absolute()
        if create:
            for sub in ("root", "tmp", "networks"):
                (self.folder / sub).mkdir(parents=True, exist_ok=True)
            self.runroot.mkdir(parents=True, exist_ok=True)
            self.containers_conf.write_text(self._containers_conf())
            self.storage_conf.write_text(
                "[storage]\n"
                'driver = "overlay"\n'
                f"graphroot = {_toml_string(str(self.graphroot))}\n"
                f"runroot = {_toml_string(str(self.runroot))}\n")

    def __repr__(self) -> str:
        return f"Store({str(self.folder)!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ---- layout ----
    @property
    def graphroot(self) -> Path:
        return self.folder / "root"

    @property
    def runroot(self) -> Path:
        """Not under ``folder``: Podman 4.3 refuses a runroot longer than 50 characters in the cleanup
        command that conmon runs when a container exits ("the specified runroot is longer than 50
        characters"); that cleanup then never happens (no ``--rm``, mounts kept) and ``podman run``
        waits 20 s for it. A short folder on /run, named by a hash of ``folder``."""
        return RUNROOT_BASE / hashlib.sha256(str(self.folder).encode()).hexdigest()[:16]

    @property
    def tmp_dir(self) -> Path:
        return self.folder / "tmp"

    @property
    def containers_conf(self) -> Path:
        return self.folder / "containers.conf"

    @property
    def storage_conf(self) -> Path:
        return self.folder / "storage.conf"

    def _containers_conf(self) -> str:
        conmon_env = [f"PATH={SYSTEM_PATH}", *(f"{k}={v}" for k, v in self.env.items())]
        return (
            "[containers]\n"
            '# No limit above the host\'s (no CAP_SYS_RESOURCE here); never pass --ulimit: it replaces these.\n'
            'default_ulimits = ["nofile=8192:8192", "nproc=4096:4096"]\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'runtime = "runc"\n'
            'events_logger = "file"\n'
            'lock_type = "file"\n'
            f"tmp_dir = {_toml_string(str(self.tmp_dir))}\n"
            f"conmon_env_vars = [{', '.join(_toml_string(e) for e in conmon_env)}]\n"
            "[network]\n"
            f"network_config_dir = {_toml_string(str(self.folder / 'networks'))}\n")

    @property
    def env(self) -> dict[str, str]:
        """The environment that points podman at this store."""
        return {"CONTAINERS_CONF": str(self.containers_conf), "CONTAINERS_STORAGE_CONF": str(self.storage_conf)}

    def sshd_setenv(self, extra: Mapping[str, str] | None = None) -> str:
        """One sshd_config line setting this store's environment and ``extra`` (e.g. ``{"PATH": ...}``)
        in the host's sessions. One line with every pair: sshd uses only the FIRST ``SetEnv`` line of
        its configuration and ignores the others, so do not add a second one beside this."""
        pairs = {**self.env, **(extra or {})}
        words = []
        for name, value in pairs.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or any(c in value for c in '"\\\n'):
                raise ValueError(f"cannot write {name}={value!r} into an sshd SetEnv line")
            words.append(f'"{name}={value}"' if re.search(r"[\s#']", value) else f"{name}={value}")
        return "SetEnv " + " ".join(words) + "\n"

    # ---- podman ----
    def podman(self, *args: str | Path, check: bool = True, timeout: float = 300,
               input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``podman ARGS`` on this store; with ``check`` a failure raises ``PodmanError``."""
        argv = [shutil.which("podman") or "podman", *(str(a) for a in args)]
        done = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True,
                              timeout=timeout, input=input)
        if check and done.returncode != 0:
            raise PodmanError(done.returncode, argv, done.stdout, done.stderr)
        return done

    def has_image(self, image: str = IMAGE) -> bool:
        return self.podman("image", "exists", image, check=False).returncode == 0

    def image_id(self, image: str = IMAGE) -> str:
        """The full id (sha256 hex, no prefix) of ``image`` in this store; PodmanError when absent."""
        return self.podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()

    def containers(self) -> list[dict[str, Any]]:
        """Every container of this store, running or not (``podman ps -a --format json``: ``Names``,
        ``Labels``, ``State``, ``Image``, ``Command``, ``Pid``...)."""
        out = self.podman("ps", "-a", "--format", "json").stdout.strip()
        return json.loads(out) if out else []

    def remove_all(self) -> None:
        """Force-remove every container of this store (stopping the running ones at once)."""
        done = self.podman("rm", "--all", "--force", "--time", "0", check=False, timeout=120)
        if done.returncode != 0 and self.containers():
            raise PodmanError(done.returncode, done.args, done.stdout, done.stderr)

    def destroy(self) -> None:
        """Remove every container, then unmount and delete the folder. Leaves every other store alone."""
        if self.folder.exists() and self.containers_conf.exists() and self.storage_conf.exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self.remove_all()
        for place in (self.folder, self.runroot):
            if not place.exists():
                continue
            _kill_conmons_under(place)
            _unmount_under(place)
            shutil.rmtree(place, ignore_errors=True)
            if place.exists():  # a mount that reappeared, or one busy a moment ago
                _unmount_under(place, lazy=True)
                shutil.rmtree(place)
        with contextlib.suppress(OSError):
            RUNROOT_BASE.rmdir()  # only when no other store has its runroot there


def _mountinfo(path: str = "/proc/self/mountinfo") -> list[tuple[str, str, str, str]]:
    """(root, mount point, filesystem type, super options) of each mount, octal escapes decoded."""
    def unescape(field: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)

    mounts = []
    for line in Path(path).read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) >= 5 and len(tail) >= 3:
            mounts.append((unescape(fields[3]), unescape(fields[4]), tail[0], tail[2]))
    return mounts


def _unmount_under(folder: Path, lazy: bool = False) -> None:
    prefix = str(folder).rstrip("/") + "/"
    points = {m[1] for m in _mountinfo() if m[1] == str(folder) or m[1].startswith(prefix)}
    for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
        argv = ["umount", *(["-l"] if lazy else []), point]
        if subprocess.run(argv, capture_output=True, timeout=60).returncode != 0 and not lazy:
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)


def _kill_conmons_under(folder: Path) -> None:
    """SIGKILL (by PID) each conmon whose command line names a path under ``folder``: one whose container
    podman could not remove. Nothing else is touched, whatever its command line says."""
    marker = (str(folder).rstrip("/") + "/").encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0]) == b"conmon" and any(marker in arg for arg in argv[1:]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)


def other_image(store: Store, image: str = IMAGE) -> str:
    """Put into ``store`` a different image under the name ``image`` (another digest: a one-file rootfs
    with no Python, imported in a moment); returns its id. ``image`` as it was there before loses the name."""
    member = f"this is not {image}; made {time.time_ns()}\n".encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("fsdpctl-other-image")
        info.size, info.mtime, info.mode = len(member), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(member))
    rootfs = store.folder / f"other-image-{os.getpid()}.tar"
    rootfs.write_bytes(buffer.getvalue())
    try:
        store.podman("import", "-q", "--change", "LABEL org.fsdpctl.test-image=other", rootfs, image)
    finally:
        rootfs.unlink(missing_ok=True)
    return store.image_id(image)


# ---- namespace hosts ---------------------------------------------------------------------------------
def cgroup_setup(mountinfo: str = "/proc/self/mountinfo") -> str:
    """Shell (each command ending in ``&&``) that mounts this machine's cgroup hierarchies again under
    ``/sys/fs/cgroup``, for ``Lab.start_sshd(setup=...)``: ``ip netns exec`` mounts a fresh ``/sys`` and
    runc then finds no cgroups ("no cgroup mount found in mountinfo"). Read from the mounts this process
    sees: a tmpfs with one v1 hierarchy per folder (controllers co-mounted as they are here, ``name=``
    hierarchies with ``none``) and a cgroup2 ``unified``, or a single cgroup2 on ``/sys/fs/cgroup``.
    Empty when there are no cgroups."""
    base = "/sys/fs/cgroup"
    try:
        mounts = _mountinfo(mountinfo)
        controllers = {line.split()[0] for line in Path("/proc/cgroups").read_text().splitlines()[1:] if line}
    except OSError:
        return ""
    top = [m for m in mounts if m[1] == base]
    if top and top[-1][2] == "cgroup2":
        return f"mount -t cgroup2 none {base} && "
    commands, seen = [], set()
    for _root, point, fstype, options in mounts:
        if not point.startswith(base + "/") or point in seen or fstype not in ("cgroup", "cgroup2"):
            continue
        seen.add(point)
        quoted = shlex.quote(point)
        kept = [o for o in options.split(",") if o not in ("rw", "ro") and not o.startswith("release_agent=")]
        if fstype == "cgroup2":
            commands.append(f"mkdir -p {quoted} && mount -t cgroup2 "
                            + (f"-o {shlex.quote(','.join(kept))} " if kept else "") + f"none {quoted} && ")
            continue
        if not any(o in controllers for o in kept):
            kept.insert(0, "none")
        commands.append(f"mkdir -p {quoted} && mount -t cgroup -o {shlex.quote(','.join(kept))} cgroup {quoted} && ")
    if not commands:
        return ""
    links = []
    with contextlib.suppress(OSError):
        for entry in sorted(Path(base).iterdir()):
            if entry.is_symlink():  # e.g. cpu -> cpu,cpuacct
                links.append(f"ln -s {shlex.quote(os.readlink(entry))} {shlex.quote(str(entry))} && ")
    return f"mount -t tmpfs -o mode=755 tmpfs {base} && " + "".join(commands) + "".join(links)


CGROUP_SETUP: str = cgroup_setup()


def no_podman_path(folder: Path) -> str:
    """Fill ``folder`` with symlinks to every executable in /usr/local/bin, /usr/bin, /bin, /usr/sbin and
    /sbin but podman (and docker), the first of a name winning as on a PATH; returns a PATH holding only
    ``folder``, for ``SetEnv PATH=...`` on a host that must have no podman."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for directory in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            link = folder / entry.name
            if entry.name in _NOT_PODMAN or link.is_symlink() or link.exists():
                continue
            with contextlib.suppress(OSError):
                if entry.is_file() and os.access(entry.path, os.X_OK):
                    link.symlink_to(entry.path)
    return str(folder.absolute())
