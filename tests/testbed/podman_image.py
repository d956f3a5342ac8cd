"""The container tests' image, built once and cached: ``image_archive()`` builds ``IMAGE`` (Debian bookworm
minbase, a venv at ``/opt/venv`` with CPU torch, tokenizers, numpy, py-spy; ``/opt/venv/bin`` first on the
image's PATH, so ``python`` and ``py-spy`` are the venv's) once and keeps it as an archive in a cache folder
that later calls and later test sessions reuse; the archive's name carries a hash of the recipe, so a
changed recipe builds anew. About 95 s here (mmdebstrap 35 s, pip 25 s, commit 20 s, save 9 s); loading it
into a store (``podman.Store.load``) takes 12 to 30 s.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from .podman import IMAGE, SYSTEM_PATH, PodmanError, Store

TORCH_REQUIREMENT = "torch==2.13.0+cpu"  # explicit "+cpu": without it pip resolves the CUDA build (5.3 GB)
DEFAULT_CACHE = Path("/var/tmp/fsdpctl-test-image")
CACHE_ENV = "FSDPCTL_TEST_IMAGE_CACHE"
ARCHIVE_FORMAT = "docker-archive"  # `podman load` read it no slower than oci-archive here (both 12 to 44 s)

# ---- the recipe (every field goes into the archive's name: change one, and the image is built anew) ----
_VENV = "/opt/venv"
_IMAGE_PATH = f"{_VENV}/bin:{SYSTEM_PATH}"
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


