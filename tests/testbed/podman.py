"""Podman on the testbed: a test image built once and cached, image stores of their own, cgroups for namespace hosts.

* ``image_archive()`` builds ``IMAGE`` (Debian bookworm minbase, a venv at ``/opt/venv`` with CPU torch,
  tokenizers, numpy, py-spy; ``/opt/venv/bin`` first on the image's PATH, so ``python`` and ``py-spy`` are
  the venv's) once and keeps it as an archive in a cache folder that later calls and later test sessions
  reuse; the archive's name carries a hash of the recipe, so a changed recipe builds anew. About 95 s
  here (mmdebstrap 35 s, pip 25 s, commit 20 s, save 9 s); loading it into a store takes 12 to 30 s.
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
import fcntl
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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

IMAGE = "localhost/fsdpctl-test:2.13.0"
IMAGE_PYTHON = "/opt/venv/bin/python"
TORCH_REQUIREMENT = "torch==2.13.0+cpu"  # explicit "+cpu": without it pip resolves the CUDA build (5.3 GB)

DEFAULT_CACHE = Path("/var/tmp/fsdpctl-test-image")
RUNROOT_BASE = Path("/run/fsdpctl-podman")  # every store's runroot: see Store.runroot
CACHE_ENV = "FSDPCTL_TEST_IMAGE_CACHE"
ARCHIVE_FORMAT = "docker-archive"  # `podman load` read it no slower than oci-archive here (both 12 to 44 s)

# ---- the recipe (every field goes into the archive's name: change one, and the image is built anew) ----
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_VENV = "/opt/venv"
_IMAGE_PATH = f"{_VENV}/bin:{_SYSTEM_PATH}"
_MMDEBSTRAP = ("--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm")
_PIP_PACKAGES = (TORCH_REQUIREMENT, "tokenizers", "numpy", "py-spy")
# What the build container sees of this machine's pip configuration (mounted read-only when present).
_WHEELS_IN = "/opt/host-wheels"
_CERT_IN = "/etc/ssl/certs/host-ca.crt"
_BUILD_SCRIPT = (
    f"set -e; python3 -m venv {_VENV}; "
    f"cert=; if [ -f {_CERT_IN} ]; then cert='--cert {_CERT_IN}'; fi; "
    f"{_VENV}/bin/pip install -q --no-cache-dir --disable-pip-version-check $cert --find-links {_WHEELS_IN} "
    + " ".join(shlex.quote(p) for p in _PIP_PACKAGES) + "; "
    f"{_VENV}/bin/python -c \"import numpy, tokenizers, torch; "
    f"assert torch.__version__ == '{TORCH_REQUIREMENT.split('==')[1]}', torch.__version__\"; "
    f"{_VENV}/bin/py-spy --version >/dev/null; rm -rf /root/.cache"
)
_COMMIT_CHANGES = (f"ENV PATH={_IMAGE_PATH}", "LABEL org.fsdpctl.test-image={key}")
_RECIPE = json.dumps({"format": 1, "image": IMAGE, "mmdebstrap": _MMDEBSTRAP, "script": _BUILD_SCRIPT,
                      "changes": _COMMIT_CHANGES, "archive": ARCHIVE_FORMAT}, sort_keys=True)
RECIPE_KEY = hashlib.sha256(_RECIPE.encode()).hexdigest()[:16]
# Environment a build container inherits when this machine has it (a proxy, a package index).
_PASS_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "http_proxy", "https_proxy",
             "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")

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
        conmon_env = [f"PATH={_SYSTEM_PATH}", *(f"{k}={v}" for k, v in self.env.items())]
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

    def load(self, archive: Path, image: str = IMAGE) -> str:
        """Load an archive (``image_archive()``) into this store, named ``image``; returns the image id."""
        done = self.podman("load", "-q", "-i", archive, timeout=900)
        loaded = re.findall(r"Loaded image(?:\(s\))?: *(\S+)", done.stdout)
        if image not in loaded and not self.has_image(image):
            if not loaded:
                raise RuntimeError(f"podman load {archive} named no image: {_tail(done.stdout + done.stderr)}")
            self.podman("tag", loaded[-1].split(",")[0], image)
        return self.image_id(image)

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


# ---- the image, built once ---------------------------------------------------------------------------
def archive_name() -> str:
    """The cached archive's file name: the image's tag and the recipe's hash."""
    extension = {"oci-archive": "oci.tar", "docker-archive": "docker.tar"}[ARCHIVE_FORMAT]
    return f"fsdpctl-test-{IMAGE.rsplit(':', 1)[1]}-{RECIPE_KEY}.{extension}"


def image_archive(cache: Path | None = None) -> Path:
    """The path of an archive of ``IMAGE`` (``Store.load`` it), built here on the first call and kept in
    ``cache`` (default ``$FSDPCTL_TEST_IMAGE_CACHE`` or ``/var/tmp/fsdpctl-test-image``) for every later
    call and test session. Safe when several processes call it at once: one builds (a private store in
    the cache folder, removed afterwards) under a file lock, and the rest wait for it. A build that fails
    raises RuntimeError with the failing step's stderr tail."""
    folder = Path(cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).absolute()
    final = folder / archive_name()
    if final.is_file():
        return final
    folder.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder / ".lock", timeout=3600):
        if final.is_file():  # another process built it while this one waited
            return final
        for stale in folder.glob("build-*"):  # left by a build that was killed (no one builds now)
            Store(stale, create=False).destroy()
        for stale in folder.glob("*.tmp-*"):
            stale.unlink(missing_ok=True)
        _build(folder, final)
    return final


@contextlib.contextmanager
def _exclusive(path: Path, timeout: float) -> Iterator[None]:
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"waited {timeout:.0f} s for {path} (another build of the test image)") \
                        from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _host_wheels() -> Path | None:
    for candidate in (*os.environ.get("PIP_FIND_LINKS", "").split(), "/opt/wheels"):
        if Path(candidate).is_dir():
            return Path(candidate)
    return None


def _host_cert() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT", ""), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _build(folder: Path, final: Path) -> None:
    store = Store(folder / f"build-{os.getpid()}")
    base = f"localhost/fsdpctl-test-base:{RECIPE_KEY}"
    partial = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    step = "mmdebstrap"
    try:
        rootfs = store.folder / "rootfs.tar"
        done = subprocess.run(["mmdebstrap", "--quiet", *_MMDEBSTRAP, str(rootfs)], capture_output=True,
                              text=True, timeout=1800)
        if done.returncode != 0:
            raise PodmanError(done.returncode, done.args, done.stdout, done.stderr)
        step = "import"
        store.podman("import", "-q", rootfs, base, timeout=600)
        rootfs.unlink()
        step = "pip install"
        mounts = []
        if (wheels := _host_wheels()) is not None:
            mounts += ["-v", f"{wheels}:{_WHEELS_IN}:ro"]
        if (cert := _host_cert()) is not None:
            mounts += ["-v", f"{cert}:{_CERT_IN}:ro"]
        passed = [f"--env={name}" for name in _PASS_ENV if os.environ.get(name)]
        store.podman("run", "--name", "build", "--network", "host", *mounts, *passed, base,
                     "bash", "-c", _BUILD_SCRIPT, timeout=3600)
        step = "commit"
        changes = [a for c in _COMMIT_CHANGES for a in ("--change", c.format(key=RECIPE_KEY))]
        store.podman("commit", "-q", *changes, "build", IMAGE, timeout=1200)
        store.podman("rm", "build")
        step = "save"
        store.podman("save", "-q", "--format", ARCHIVE_FORMAT, "-o", partial, IMAGE, timeout=1200)
        os.replace(partial, final)
    except (subprocess.SubprocessError, OSError) as error:
        raise RuntimeError(f"building the test image {IMAGE} failed at {step}: {error}") from error
    finally:
        partial.unlink(missing_ok=True)
        store.destroy()


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
