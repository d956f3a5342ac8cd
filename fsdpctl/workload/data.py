"""Corpus and tokenizer: from text on disk to a cached file of token ids.

Corpora: ``builtin`` (docstrings of the Python standard library: present on every machine, and
identical wherever the same Python version is installed), ``wikitext2`` (raw files from
``--data-dir`` or the ``datasets`` library), or a path to a text file or folder.

A byte-level BPE is trained on the corpus and the encoded tokens are stored as a flat uint16 /
uint32 file; both are cached under ``cache_dir/tok-<corpus hash>-v<vocab size>/``. Only the
caller that ``build``s (local rank 0 of each node) writes; every write is a temp file followed by
``os.replace``, so nodes sharing one cache directory never see a half-written file.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ConfigError

BUILTIN_CAP_CHARS = 1_000_000
EOT = "<|endoftext|>"
RECIPE = "bpe-bytelevel-1"  # bump when the tokenizer recipe changes, to invalidate caches
# Parts of the standard library that distributions ship separately (or patch per machine).
_STDLIB_SKIP_DIRS = {"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "lib2to3",
                     "distutils", "ensurepip", "site-packages", "dist-packages", "__pycache__"}
_STDLIB_SKIP_FILES = {"site.py", "sysconfig.py"}


@dataclass
class Corpus:
    name: str
    train_docs: list[str]
    val_docs: list[str] | None  # None: split off the tail of train by val_fraction
    digest: str


def _digest(train: list[str], val: list[str] | None) -> str:
    h = hashlib.sha256(RECIPE.encode())
    for part in (train, val or []):
        h.update(b"\x00split\x00")
        for doc in part:
            h.update(doc.encode("utf-8"))
            h.update(b"\x00")
    return h.hexdigest()


def _stdlib_files(root: str) -> list[str]:
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _STDLIB_SKIP_DIRS and not d.startswith("config-")]
        rel = os.path.relpath(folder, root)
        for name in files:
            if (name.endswith(".py") and name not in _STDLIB_SKIP_FILES
                    and not name.startswith("_sysconfigdata")):
                found.append(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return sorted(found)  # the walk order varies between filesystems; sorted paths do not


def build_builtin_corpus(cap_chars: int = BUILTIN_CAP_CHARS) -> list[str]:
    """Docstrings (40+ characters) of the standard library's modules, classes and functions,
    in sorted path order, up to ``cap_chars`` characters."""
    root = sysconfig.get_paths()["stdlib"]
    docs: list[str] = []
    total = 0
    for rel in _stdlib_files(root):
        try:
            tree = ast.parse(Path(root, rel).read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= 40:
                    doc = doc[: cap_chars - total]
                    docs.append(doc)
                    total += len(doc)
                    if total >= cap_chars:
                        return docs
    return docs


def _builtin_fingerprint() -> str:
    """Cheap key for the builtin corpus cache: Python version and the stdlib files' sizes."""
    root = sysconfig.get_paths()["stdlib"]
    h = hashlib.sha256(f"{sys.version_info[:3]}|{BUILTIN_CAP_CHARS}|{RECIPE}".encode())
    for rel in _stdlib_files(root):
        h.update(f"{rel}:{os.path.getsize(os.path.join(root, rel))};".encode())
    return h.hexdigest()[:20]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_builtin(cache_dir: Path) -> Corpus:
    """The builtin corpus, cached as JSON (parsing the stdlib takes ~1.5 s per process)."""
    path = cache_dir / f"builtin-{_builtin_fingerprint()}.json"
    try:
        docs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        docs = build_builtin_corpus()
        atomic_write_bytes(path, json.dumps(docs).encode("utf-8"))
    return Corpus("builtin", docs, None, _digest(docs, None))


WIKITEXT_FILES = ("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw")


def wikitext2_cache(cache_dir: Path) -> Path:
    return cache_dir / "wikitext-2-raw"


def fetch_wikitext2(cache_dir: Path) -> None:
    """Download WikiText-2 (raw) with ``datasets`` into the cache, unless it is there already."""
    target = wikitext2_cache(cache_dir)
    if not all((target / f).is_file() for f in WIKITEXT_FILES):
        _fetch_wikitext2(target)


def load_wikitext2(data_dir: str | None, cache_dir: Path) -> Corpus:
    """WikiText-2 (raw): from ``data_dir``, else from the cache that fetch_wikitext2 fills."""
    if data_dir is None:
        data_dir = str(wikitext2_cache(cache_dir))
    missing = [f for f in WIKITEXT_FILES if not Path(data_dir, f).is_file()]
    if missing:
        raise ConfigError("data_dir", f"{data_dir} lacks {', '.join(missing)}",
                          "point --data-dir at the folder of the WikiText-2 raw files")
    train, val = (Path(data_dir, f).read_text(encoding="utf-8") for f in WIKITEXT_FILES[:2])
    return Corpus("wikitext2", [train], [val], _digest([train], [val]))


def _fetch_wikitext2(target: Path) -> None:
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError("dataset", "wikitext2 needs --data-dir or the `datasets` library, "
                          "and neither is available",
                          "download wiki.{train,valid,test}.raw and pass --data-dir DIR, "
                          "or pip install datasets") from None
    try:
        splits = datasets.load_dataset("wikitext", "wikitext-2-raw-v1")
    except Exception as exc:  # any hub/network failure becomes one clear line
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError("dataset", f"could not fetch wikitext2 with datasets ({first})",
                          "pass --data-dir with the raw files instead") from None
    for filename, split in zip(WIKITEXT_FILES, ("train", "validation", "test"), strict=True):
        atomic_write_bytes(target / filename, "".join(splits[split]["text"]).encode("utf-8"))


def load_path(path: str) -> Corpus:
    """A text file, or every UTF-8 file under a folder (sorted paths, hidden files skipped)."""
    root = Path(path).expanduser()
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(root).parts))
    else:
        raise ConfigError("dataset", f"{path} is not builtin, wikitext2, a file or a folder",
                          "give builtin, wikitext2, or the path of a text file or folder")
    docs = []
    for file in files:
        try:
            docs.append(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable: not text
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ConfigError("dataset", f"{path} holds no UTF-8 text", "give a text file or folder")
    return Corpus(f"path:{root}", docs, None, _digest(docs, None))


def load_corpus(dataset: str, data_dir: str | None, cache_dir: Path) -> Corpus:
    if dataset == "builtin":
        return load_builtin(cache_dir)
    if dataset == "wikitext2":
        return load_wikitext2(data_dir, cache_dir)
    return load_path(dataset)


# ---------------------------------------------------------------- tokenizer and token files


@dataclass
class TokenData:
    train: np.ndarray  # flat token ids (a read-only memmap)
    val: np.ndarray
    vocab_size: int  # the tokenizer's real size (the model pads it)
    tokenizer_path: Path
    tokenizer_sha: str
    corpus_digest: str


def _train_tokenizer(docs: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(docs, trainer=trainer)
    return tokenizer


def _encode(tokenizer, docs: list[str], dtype) -> np.ndarray:
    eot = tokenizer.token_to_id(EOT)
    lines = [line for doc in docs for line in doc.splitlines(keepends=True)]
    encoded = iter(tokenizer.encode_batch(lines, add_special_tokens=False))
    ids: list[int] = []
    for doc in docs:
        for _ in doc.splitlines(keepends=True):
            ids.extend(next(encoded).ids)
        ids.append(eot)
    return np.asarray(ids, dtype=dtype)


def cache_folder(cache_dir: Path, corpus: Corpus, vocab_size: int) -> Path:
    return cache_dir / f"tok-{corpus.digest[:16]}-v{vocab_size}"


def build_tokens(corpus: Corpus, vocab_size: int, folder: Path) -> None:
    """Train the tokenizer and encode the corpus into ``folder`` unless already there."""
    if (folder / "meta.json").is_file():
        return
    docs = corpus.train_docs + (corpus.val_docs or [])
    tokenizer = _train_tokenizer(docs, vocab_size)
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 65535 else np.uint32
    atomic_write_bytes(folder / "tokenizer.json", tokenizer.to_str().encode("utf-8"))
    atomic_write_bytes(folder / "train.bin", _encode(tokenizer, corpus.train_docs, dtype).tobytes())
    if corpus.val_docs is not None:
        atomic_write_bytes(folder / "val.bin", _encode(tokenizer, corpus.val_docs, dtype).tobytes())
    meta = {"corpus": corpus.name, "digest": corpus.digest, "vocab_size": tokenizer.get_vocab_size(),
            "dtype": np.dtype(dtype).name, "split": corpus.val_docs is not None}
    atomic_write_bytes(folder / "meta.json", json.dumps(meta).encode("utf-8"))  # written last


def load_tokens(folder: Path, val_fraction: float) -> TokenData:
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    dtype = np.dtype(meta["dtype"])
    train = np.memmap(folder / "train.bin", dtype=dtype, mode="r")
    if meta["split"]:
        val = np.memmap(folder / "val.bin", dtype=dtype, mode="r")
    else:
        cut = len(train) - int(len(train) * val_fraction)
        train, val = train[:cut], train[cut:]
    sha = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    return TokenData(train, val, meta["vocab_size"], folder / "tokenizer.json", sha, meta["digest"])


def default_cache_dir(cache_dir: str | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "fsdpctl"
