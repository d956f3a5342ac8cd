"""What travels to the nodes: the node scripts, the workload package and the user's code, as one tar.

The code folder is chosen the way its owner would: in a git work tree, what git would commit (tracked
files and untracked ones it does not ignore); elsewhere every file but ``.git``, virtual environments,
``__pycache__``, ``runs/`` and the patterns of a ``.fsdpctlignore`` (honoured in a git tree too). A
size limit stops a data set or a checkpoint from being copied by mistake.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .errors import UsageError
from .plan.make import SHIPPED_PACKAGE_DIR
from .plan.types import CodePlan

CODE_DIR = "code"
"""Where the user's code lands in the run directory on every node."""
IGNORE_FILE = ".fsdpctlignore"
DEFAULT_CODE_LIMIT_MB = 100
_SKIPPED_ANYWHERE = {".git", "__pycache__"}
_SKIPPED_AT_TOP = {"runs", "rendered"}  # fsdpctl's own run and render folders
_PACKAGE_ROOT = Path(__file__).resolve().parent
SHIPPED_PACKAGES = ("workload", "node", "node/startup", "node/telemetry")
"""fsdpctl's packages every node gets (``pkg/fsdpctl/...``): the workload, the helpers next to the ranks,
and the hook every rank runs first."""


@dataclass(frozen=True)
class CodeManifest:
    """The files of a code folder that go to the nodes: (path relative to ``root``, bytes)."""

    root: Path
    files: tuple[tuple[str, int], ...]
    origin: str
    """``git`` (what git would commit) or ``files`` (a walk with the ignore rules)."""
    skipped_links: tuple[str, ...] = ()
    """Symbolic links leaving the folder: not copied (they would point elsewhere on a node)."""

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    def largest(self, count: int = 5) -> list[tuple[str, int]]:
        return sorted(self.files, key=lambda f: (-f[1], f[0]))[:count]

    def plan(self) -> CodePlan:
        """What the plan records of it (no file list: plan.json stays small)."""
        return CodePlan(source=str(self.root), files=len(self.files), bytes=self.total_bytes,
                        largest=tuple(self.largest()), origin=self.origin, skipped_links=self.skipped_links)


def human_size(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def _ignore_patterns(root: Path) -> list[str]:
    path = root / IGNORE_FILE
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _ignored(relative: str, is_dir: bool, patterns: list[str]) -> bool:
    """gitignore's common forms: ``name``, ``*.ext``, ``dir/``, ``/anchored``, ``path/with/*``."""
    name = relative.rsplit("/", 1)[-1]
    for pattern in patterns:
        directory_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        if directory_only and not is_dir:
            continue
        anchored = pattern.startswith("/") or "/" in pattern
        pattern = pattern.lstrip("/")
        if fnmatch.fnmatchcase(relative if anchored else name, pattern):
            return True
    return False


def _git_files(root: Path) -> Optional[list[str]]:
    """What git would commit under ``root``; None when it is not a git work tree (or git is missing)."""
    if shutil.which("git") is None:
        return None
    try:
        inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=30)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [p for p in listed.stdout.decode("utf-8", "surrogateescape").split("\0") if p]


def _skipped_dir(root: Path, relative: str, patterns: list[str]) -> bool:
    name = relative.rsplit("/", 1)[-1]
    return (name in _SKIPPED_ANYWHERE or ("/" not in relative and name in _SKIPPED_AT_TOP)
            or (root / relative / "pyvenv.cfg").exists()  # a virtual environment
            or _ignored(relative, True, patterns))


def _walk_files(root: Path, patterns: list[str]) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirs[:] = sorted(d for d in dirs if not _skipped_dir(root, prefix + d, patterns))
        found += [prefix + f for f in sorted(files) if not _ignored(prefix + f, False, patterns)]
    return found


def collect_code(root: Path, limit_bytes: int) -> CodeManifest:
    """The manifest of ``root``; raises UsageError when it is not a folder or is over ``limit_bytes``."""
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"--code {root}: not a folder", "give the folder that holds your training code")
    patterns = _ignore_patterns(root)
    listed = _git_files(root)
    origin = "git" if listed is not None else "files"
    if listed is None:
        listed = _walk_files(root, patterns)
    files, links = [], []
    for relative in listed:
        parts = relative.split("/")
        if _ignored(relative, False, patterns) or \
                any(_skipped_dir(root, "/".join(parts[:i]), patterns) for i in range(1, len(parts))):
            continue
        path = root / relative
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(root):
                links.append(relative)
                continue
        if path.is_file():
            files.append((relative, path.lstat().st_size if path.is_symlink() else path.stat().st_size))
    manifest = CodeManifest(root, tuple(sorted(files)), origin, tuple(sorted(links)))
    if manifest.total_bytes > limit_bytes:
        largest = ", ".join(f"{name} ({human_size(size)})" for name, size in manifest.largest())
        raise UsageError(f"--code {root}: {human_size(manifest.total_bytes)} in {len(files)} files is over the "
                         f"{human_size(limit_bytes)} limit; the largest: {largest}",
                         f"leave data and checkpoints out ({IGNORE_FILE} or .gitignore), or raise --code-limit")
    return manifest


class TarStream:
    """An uncompressed tar made as it is read: headers by tarfile, the files' bytes from disk, chunk
    by chunk, so a large project is never held in memory (nor copied once per node), and its size is
    known before the first byte goes (the node agent reads exactly that many)."""

    def __init__(self) -> None:
        self.entries: list[tuple[bytes, bytes | Path | None, int]] = []  # (header, data, size)
        self.size = 0
        self.scripts: dict[int, str] = {}  # entry index: the node script it is

    def add(self, info: tarfile.TarInfo, data: bytes | Path | None = None, node_script: bool = False) -> None:
        header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
        if node_script:
            self.scripts[len(self.entries)] = info.name
        self._append((header, data, info.size))

    def _append(self, entry: tuple[bytes, bytes | Path | None, int]) -> None:
        self.entries.append(entry)
        self.size += len(entry[0]) + -(-entry[2] // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE  # data padded

    def for_node(self, script: str) -> TarStream:
        """This archive with one node script of all: ``script``, the one that node runs. Every node's
        script in every node's archive made the bytes a launcher sends grow as nodes squared (at
        1,024 nodes, 2.6 MB of the others' scripts to each, six times its own 0.4 MB)."""
        if not self.scripts:
            return self
        own = TarStream()
        for index, entry in enumerate(self.entries):
            name = self.scripts.get(index)
            if name is None or name == script:
                own._append(entry)
        return own

    def __len__(self) -> int:
        end = self.size + 2 * tarfile.BLOCKSIZE  # two zero blocks, then padding to a whole record
        return end + -end % tarfile.RECORDSIZE

    def chunks(self, size: int = 1 << 16) -> Iterator[bytes]:
        """The archive's bytes, in pieces of ``size`` to twice that (the last one shorter); a file that shrank
        meanwhile is an error. Headers, small files and padding are joined: each piece is one SSH send,
        and the workload package alone was 530 pieces, every one a packet, sent again to every node."""
        pending = bytearray()
        for piece in self._pieces(size):
            if not pending and len(piece) >= size:  # a large file's read: as it is, not copied
                yield piece
                continue
            pending += piece
            if len(pending) >= size:
                yield bytes(pending)
                pending.clear()
        if pending:
            yield bytes(pending)

    def _pieces(self, size: int) -> Iterator[bytes]:
        for header, data, length in self.entries:
            yield header
            if isinstance(data, Path):
                with data.open("rb") as handle:
                    left = length
                    while left:
                        piece = handle.read(min(size, left))
                        if not piece:
                            raise UsageError(f"{data}: changed while it was being copied to the nodes",
                                             "launch again once the file stays put")
                        left -= len(piece)
                        yield piece
            elif data:
                yield data
            if length % tarfile.BLOCKSIZE:
                yield NUL * (tarfile.BLOCKSIZE - length % tarfile.BLOCKSIZE)
        yield NUL * (len(self) - self.size)

    def getvalue(self) -> bytes:
        """The whole archive in memory (for a local copy, and tests)."""
        return b"".join(self.chunks())


NUL = b"\0"


@dataclass(frozen=True)
class Payload:
    """What every node gets when it starts: the tar (``files``) and the run's secrets, which travel
    only inside the command that starts a node (or the environment of a Slurm submission)."""

    files: TarStream
    secrets: dict[str, str] = field(default_factory=dict, repr=False)

    def secret_blob(self) -> bytes:
        return json.dumps(self.secrets).encode() if self.secrets else b""


def _private(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """The user's own only, whatever their umask: files 0600 (0700 when executable)."""
    if info.isfile():
        info.mode = 0o700 if info.mode & 0o100 else 0o600
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def node_payload(scripts: dict[str, str], code: Optional[CodeManifest] = None) -> TarStream:
    """One uncompressed tar for every node (``for_node``: with its own script only): the node scripts,
    ``pkg/`` (the workload package, so a node needs nothing of fsdpctl installed) and ``code/``.
    Uncompressed: code is mostly small text, and gzip on one launcher core is slower than the network
    it would save."""
    tar = TarStream()

    def add_bytes(name: str, data: bytes, mode: int = 0o600, node_script: bool = False) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, 0
        tar.add(info, data, node_script)

    for name, text in scripts.items():
        add_bytes(name, text.encode(), 0o700, node_script=True)
    add_bytes(f"{SHIPPED_PACKAGE_DIR}/fsdpctl/__init__.py", (_PACKAGE_ROOT / "__init__.py").read_bytes())
    for package in SHIPPED_PACKAGES:
        for source in sorted((_PACKAGE_ROOT / package).glob("*.py")):
            add_bytes(f"{SHIPPED_PACKAGE_DIR}/fsdpctl/{package}/{source.name}", source.read_bytes())
    if code is not None:
        for relative, _ in code.files:
            path = code.root / relative
            info = tarfile.TarInfo(f"{CODE_DIR}/{relative}")
            stat = path.lstat()
            info.mtime = int(stat.st_mtime)
            if path.is_symlink():  # a link inside the folder (the manifest keeps no other)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
                tar.add(_private(info))
            else:
                info.size, info.mode = stat.st_size, stat.st_mode
                tar.add(_private(info), path)
    return tar
