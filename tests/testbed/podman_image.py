"""The container tests' image, built once and cached: ``image_archive()`` builds the root file system of
``IMAGE`` (Debian bookworm minbase, a venv at ``/opt/venv`` with CPU torch, tokenizers, numpy, py-spy) in
one mmdebstrap call, the venv made and filled by its customize hooks in the new root, and keeps it as a
tar in a cache folder that later calls and later test sessions reuse; the archive's name carries a hash
of the recipe, so a changed recipe builds anew. ``load(store, archive)`` imports it into a store as
``IMAGE``, ``/opt/venv/bin`` first on its PATH (so ``python`` and ``py-spy`` are the venv's).

No container runs to build it, and nothing is committed, saved and loaded again: the build that ran pip
in a container, committed it, saved it and loaded the save took 95 s here before its load (12 to 30 s).
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

# ---- the recipe (every field goes into the archive's name: change one, and the image is built anew) ----
_VENV = "/opt/venv"
_IMAGE_PATH = f"{_VENV}/bin:{SYSTEM_PATH}"
_MMDEBSTRAP = ("--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm")
_PIP_PACKAGES = (TORCH_REQUIREMENT, "tokenizers", "numpy", "py-spy")
# What the build's root sees of this machine's pip configuration (copied in when present, removed after).
_WHEELS_IN = "/opt/host-wheels"
_CERT_IN = "/etc/ssl/certs/host-ca.crt"
# Run in the new root (``chroot "$1"``) by a customize hook, with only the environment _PASS_ENV lets through.
_BUILD_SCRIPT = (
    f"set -e; python3 -m venv {_VENV}; "
    f"cert=; if [ -f {_CERT_IN} ]; then cert='--cert {_CERT_IN}'; fi; "
    f"{_VENV}/bin/pip install -q --no-cache-dir --disable-pip-version-check $cert --find-links {_WHEELS_IN} "
    + " ".join(shlex.quote(p) for p in _PIP_PACKAGES) + "; "
    f"{_VENV}/bin/python -c \"import numpy, tokenizers, torch; "
    f"assert torch.__version__ == '{TORCH_REQUIREMENT.split('==')[1]}', torch.__version__\"; "
    f"{_VENV}/bin/py-spy --version >/dev/null; rm -rf /root/.cache {_WHEELS_IN} {_CERT_IN}"
)
_IMPORT_CHANGES = (f"ENV PATH={_IMAGE_PATH}", "LABEL org.fsdpctl.test-image={key}")
_RECIPE = json.dumps({"format": 2, "image": IMAGE, "mmdebstrap": _MMDEBSTRAP, "script": _BUILD_SCRIPT,
                      "changes": _IMPORT_CHANGES}, sort_keys=True)
RECIPE_KEY = hashlib.sha256(_RECIPE.encode()).hexdigest()[:16]
# Environment the build's pip inherits when this machine has it (a proxy, a package index).
_PASS_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "http_proxy", "https_proxy",
             "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


# ---- the image, built once ---------------------------------------------------------------------------
def archive_name() -> str:
    """The cached archive's file name: the image's tag and the recipe's hash."""
    return f"fsdpctl-test-{IMAGE.rsplit(':', 1)[1]}-{RECIPE_KEY}.rootfs.tar"


def load(store: Store, archive: Path, image: str = IMAGE) -> str:
    """Import ``archive`` (``image_archive()``) into ``store`` as ``image``; returns the image's id."""
    changes = [a for c in _IMPORT_CHANGES for a in ("--change", c.format(key=RECIPE_KEY))]
    store.podman("import", "-q", *changes, archive, image, timeout=900)
    return store.image_id(image)


def image_archive(cache: Path | None = None) -> Path:
    """The path of a root file system of ``IMAGE`` (``load`` it), built here on the first call and kept in
    ``cache`` (default ``$FSDPCTL_TEST_IMAGE_CACHE`` or ``/var/tmp/fsdpctl-test-image``) for every later
    call and test session. Safe when several processes call it at once: one builds under a file lock, and
    the rest wait for it. A build that fails raises RuntimeError with mmdebstrap's stderr tail."""
    folder = Path(cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).absolute()
    final = folder / archive_name()
    if final.is_file():
        return final
    folder.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder / ".lock", timeout=3600):
        if final.is_file():  # another process built it while this one waited
            return final
        for stale in folder.glob("build-*"):  # an earlier recipe's build store, left by a killed build
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
    partial = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    hooks = []
    if (wheels := _host_wheels()) is not None:
        hooks.append(f'--customize-hook=mkdir -p "$1"{_WHEELS_IN}')
        hooks.append(f"--customize-hook=sync-in {shlex.quote(str(wheels))} {_WHEELS_IN}")
    if (cert := _host_cert()) is not None:
        hooks.append(f"--customize-hook=upload {shlex.quote(str(cert))} {_CERT_IN}")
    passed = " ".join(shlex.quote(f"{name}={os.environ[name]}") for name in _PASS_ENV if os.environ.get(name))
    hooks.append(f'--customize-hook=env -i PATH={SYSTEM_PATH} HOME=/root {passed} chroot "$1" bash -c '
                 + shlex.quote(_BUILD_SCRIPT))
    try:
        # The tar's extension tells mmdebstrap the format; ".tmp-N" would not, so it is told.
        done = subprocess.run(["mmdebstrap", "--quiet", "--format=tar", *hooks, *_MMDEBSTRAP, str(partial)],
                              capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise PodmanError(done.returncode, done.args, done.stdout, done.stderr)
        os.replace(partial, final)
    except (subprocess.SubprocessError, OSError) as error:
        raise RuntimeError(f"building the test image {IMAGE} failed: {error}") from error
    finally:
        partial.unlink(missing_ok=True)
