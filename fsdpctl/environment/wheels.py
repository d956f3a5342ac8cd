"""Wheels on this machine, to send to nodes that cannot download them: each fetched once into the cache
(``<cache>/wheels/<sha256>/<file>``) and checked against its sha256; a wheel in a local folder is read
where it lies."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

from .resolve import Wheel, cache_dir
from .uv import ResolveError

DOWNLOAD_TIMEOUT = 60.0
_guard = threading.Lock()
_fetching: dict[str, threading.Lock] = {}


def local_path(wheel: Wheel) -> Path | None:
    """The wheel's own file when its URL is a local one."""
    parsed = urlparse(wheel.url)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if not parsed.scheme:
        return Path(wheel.url)
    return None


def is_local(wheel: Wheel) -> bool:
    return local_path(wheel) is not None


def fetch(wheel: Wheel) -> Path:
    """The wheel's file on this machine, downloaded once and checked. Raises ResolveError."""
    own = local_path(wheel)
    if own is not None:
        if not own.exists():
            raise ResolveError(f"{wheel.file}: {own} does not exist (a find_links folder changed since it was "
                               f"resolved)")
        return own
    target = cache_dir() / "wheels" / wheel.sha256 / wheel.file
    with _guard:
        lock = _fetching.setdefault(wheel.sha256, threading.Lock())
    with lock:
        if target.exists():
            os.utime(target)  # used now: the cache keeps what was used last
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{wheel.file}.{os.getpid()}.part")
        digest = hashlib.sha256()
        if urlparse(wheel.url).scheme not in ("http", "https"):
            raise ResolveError(f"{wheel.file}: {wheel.url} is neither a local file nor an http(s) URL")
        try:
            with urllib.request.urlopen(  # noqa: S310
                    wheel.url, timeout=DOWNLOAD_TIMEOUT) as response, \
                    partial.open("wb") as out:  # http(s) only: checked above
                while chunk := response.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise ResolveError(f"{wheel.file}: could not be downloaded from {wheel.url}: {exc}") from None
        if digest.hexdigest() != wheel.sha256:
            partial.unlink(missing_ok=True)
            raise ResolveError(f"{wheel.file}: its sha256 differs from the index's (a damaged download, or the "
                               f"file changed on the index)")
        partial.replace(target)
    return target


def size_of(wheel: Wheel) -> int:
    return fetch(wheel).stat().st_size


CACHE_BYTES = 20_000_000_000
"""Downloads kept on this machine, at most (the least recently used go first)."""


def prune_cache(keep_bytes: int = CACHE_BYTES) -> None:
    """Drop the least recently used downloads past ``keep_bytes`` (the cache must not grow without end)."""
    folder = cache_dir() / "wheels"
    entries = sorted((p for p in folder.glob("*/*") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True)
    total = 0
    for path in entries:
        total += path.stat().st_size
        if total > keep_bytes:
            shutil.rmtree(path.parent, ignore_errors=True)
