"""A run's chart data kept beside its collected copies (``live/charts.idx``), so a page opens on a run
of any length by reading a few MB instead of the run's GBs of metrics and GPU samples.

The collector writes it as the run goes (``ChartStore.save_index`` every ``INDEX_SECONDS`` and at the
end); a reader loads it and reads only what the files gained after it. It holds what ``ChartStore``
keeps (bounded: every series is at most twice ``charts.POINTS`` buckets), how far each file was read
(its inode, offset and the line still being written) and the metrics reader's unfinished rows, so a
loaded index goes on exactly as the store that wrote it would have. The report's figures in it are
bounded too (``fsdpctl.metrics.fold``: each figure's values as a quantile sketch once there are many),
so the index is about as large at a million steps as at ten thousand, and rewriting it whole every
``INDEX_SECONDS`` costs the same at any length. An index whose files were
replaced or cut shorter since is stale and ignored: the store is rebuilt from the files.

The file: a line ``fsdpctl-charts <version>``, a line of JSON (the header: the plain state and the
list of arrays that follow), then each array's bytes in the machine's order. Never code: nothing
in it is executed or unpickled.
"""

from __future__ import annotations

import json
import os
import sys
from array import array
from pathlib import Path
from typing import Any, Optional

MAGIC = b"fsdpctl-charts"
VERSION = 2
INDEX_NAME = "charts.idx"
"""In the run's ``live/`` folder."""
INDEX_SECONDS = 60.0
"""How often the collector writes the index while a run goes (and once at its end)."""


class _Blobs:
    """The arrays of one index, by position, and the header's list of them."""

    def __init__(self) -> None:
        self.arrays: list[array] = []
        self.listing: list[list[Any]] = []
        self.known: dict[tuple[str, bytes], int] = {}

    def put(self, values: array) -> int:
        """The array's position; an array equal to one put before is kept once (a node's GPUs share
        their sample times, most buckets their counts)."""
        key = (values.typecode, values.tobytes())
        at = self.known.get(key)
        if at is None:
            at = self.known[key] = len(self.arrays)
            self.arrays.append(values)
            self.listing.append([values.typecode, len(values)])
        return at


def _buckets_state(series: Any, blobs: _Blobs) -> dict[str, Any]:
    return {"width": series.width, "points": series.points, "limit": series.limit,
            "arrays": [blobs.put(getattr(series, name)) for name in ("x", "total", "low", "high", "count")]}


def _buckets_restore(series: Any, state: dict[str, Any], arrays: list[array]) -> None:
    series.width, series.points, series.limit = int(state["width"]), int(state["points"]), int(state["limit"])
    for name, at in zip(("x", "total", "low", "high", "count"), state["arrays"], strict=True):
        setattr(series, name, array(arrays[at].typecode, arrays[at]))  # a copy: an array may be shared


def _heat_state(heat: Any, blobs: _Blobs) -> dict[str, Any]:
    keys = sorted({key for column in heat.columns for key in column})
    sums, counts = array("d"), array("l")
    for column in heat.columns:
        for key in keys:
            cell = column.get(key)
            sums.append(cell[0] if cell else 0.0)
            counts.append(int(cell[1]) if cell else 0)
    return {"width": heat.width, "limit": heat.limit, "steps": heat.steps, "keys": keys,
            "where": [[rank, node, host] for rank, (node, host) in heat.where.items()],
            "sums": blobs.put(sums), "counts": blobs.put(counts)}


def _heat_restore(heat: Any, state: dict[str, Any], arrays: list[array]) -> None:
    heat.width, heat.limit = int(state["width"]), int(state["limit"])
    heat.steps = [int(s) for s in state["steps"]]
    keys = [int(k) for k in state["keys"]]
    sums, counts = arrays[state["sums"]], arrays[state["counts"]]
    heat.columns = []
    for c in range(len(heat.steps)):
        base = c * len(keys)
        heat.columns.append({key: [sums[base + i], counts[base + i]] for i, key in enumerate(keys)
                             if counts[base + i]})
    heat.where = {int(rank): (node, host) for rank, node, host in state["where"]}


def _sources(store: Any, root: Path) -> dict[str, Any]:
    def files(tails: dict[Path, Any]) -> list[dict[str, Any]]:
        return [{"path": os.path.relpath(path, root), "ino": tail.inode, "offset": tail.offset,
                 "partial": tail.partial.decode("latin-1")} for path, tail in tails.items() if tail.inode is not None]

    return {"metrics": files(store.metric_tails), "gpus": files(store.gpu_tails)}


def save(store: Any, path: Path) -> None:
    """Write ``store`` (a ``ChartStore``) to ``path``, whole or not at all."""
    blobs = _Blobs()
    header = {
        "sources": _sources(store, store.root),
        "sampled": store.sampled,
        "feed": store.feed.state(),
        "fold": store.fold.state(blobs.put),
        "gpu_fold": store.gpu_fold.state(),
        "train": {key: _buckets_state(series, blobs) for key, series in store.train.items()},
        "val": _buckets_state(store.val, blobs),
        "heat": _heat_state(store.heat, blobs),
        "rank_time": [[rank, _buckets_state(series, blobs)] for rank, series in store.rank_time.items()],
        "gpus": [[node, host, gpu, {name: _buckets_state(s, blobs) for name, s in series.items()}]
                 for (node, host, gpu), series in store.gpus.items()],
        "gpu_top": [[*key, value] for key, value in store.gpu_top.items()],
        "last_sample": [[*key, value] for key, value in store.last_sample.items()],
        "byteorder": sys.byteorder,
    }
    header["arrays"] = blobs.listing
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(b"%s %d\n" % (MAGIC, VERSION))
            handle.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            for values in blobs.arrays:
                values.tofile(handle)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _read(path: Path) -> Optional[tuple[dict[str, Any], list[array]]]:
    try:
        with path.open("rb") as handle:
            if handle.readline().split() != [MAGIC, str(VERSION).encode()]:
                return None
            header = json.loads(handle.readline())
            if header.get("byteorder") != sys.byteorder:
                return None
            arrays = []
            for typecode, length in header["arrays"]:
                values = array(typecode)
                values.fromfile(handle, int(length))
                arrays.append(values)
            return header, arrays
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def load(store: Any, path: Path, metrics: list[Path], gpus: list[Path]) -> bool:
    """Bring a fresh ``store`` to where the index at ``path`` left it, with its files' tails placed
    where the index stopped reading; False (the store untouched) when there is no usable index: none,
    unreadable, another version, or one of its files replaced or cut shorter since."""
    from .tails import LineTail

    found = _read(path)
    if found is None:
        return False
    header, arrays = found
    root = store.root
    tails: dict[str, dict[Path, LineTail]] = {"metrics": {}, "gpus": {}}
    try:
        for kind, wanted in (("metrics", metrics), ("gpus", gpus)):
            by_name = {os.path.relpath(p, root): p for p in wanted}
            for source in header["sources"][kind]:
                file = by_name.get(source["path"])
                if file is None:
                    continue  # no longer read (another attempt's plan): what it gave is in the charts
                stat = file.stat()
                if stat.st_ino != source["ino"] or stat.st_size < source["offset"]:
                    return False  # replaced or cut shorter: the index tells of another file
                tail = LineTail(file)
                tail.inode, tail.offset = int(source["ino"]), int(source["offset"])
                tail.partial = str(source["partial"]).encode("latin-1")
                tails[kind][file] = tail
    except (OSError, KeyError, TypeError, ValueError):
        return False
    try:
        Buckets = type(store.val)  # noqa: N806 - the store's own series class (charts imports this module)
        for key, state in header["train"].items():
            if key in store.train:
                _buckets_restore(store.train[key], state, arrays)
        _buckets_restore(store.val, header["val"], arrays)
        _heat_restore(store.heat, header["heat"], arrays)
        for rank, state in header["rank_time"]:
            _buckets_restore(store.rank_time.setdefault(int(rank), Buckets()), state, arrays)
        for node, host, gpu, figures in header["gpus"]:
            series = store.gpus.setdefault((int(node), str(host), str(gpu)), {})
            for name, state in figures.items():
                _buckets_restore(series.setdefault(name, Buckets()), state, arrays)
        store.gpu_top = {(int(n), str(h), str(g)): float(v) for n, h, g, v in header["gpu_top"]}
        store.last_sample = {(int(n), str(h)): float(v) for n, h, v in header["last_sample"]}
        store.feed.restore(header["feed"])
        store.fold.restore(header["fold"], arrays)
        store.gpu_fold.restore(header["gpu_fold"])
        store.sampled = bool(header.get("sampled"))
    except (KeyError, TypeError, ValueError, IndexError):
        store.reset()
        return False
    store.metric_tails.update(tails["metrics"])
    store.gpu_tails.update(tails["gpus"])
    return True
