"""torch's flight-recorder dumps (one per rank and kind): which collective the ranks disagree on.

A dump holds, per process group, the sequence number of the last collective each rank entered
(``last_enqueued_collective``) and finished, and the last entries themselves (operation, sizes,
Python frames). Where every rank reached collective N but some never entered N+1, those ranks are
behind: the others wait for them. Where two ranks entered different operations under the same
number, the program itself diverged. This reading works for every backend whose dumps carry that
(NCCL's; gloo's on torch 2.13 record entries as ``scheduled`` only, and the sequence numbers still
say who entered what). torch's own analyser (``fr_trace``) is run as well where this machine has
torch, and its output kept.

Dumps are pickles written on the nodes: they are read with an unpickler that builds nothing but
plain containers and scalars, so a tampered dump cannot run code here.
"""

from __future__ import annotations

import io
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stacks import is_library, short_where

_RANK_FILE = re.compile(r"^rank_(\d+)$")
ANALYSER_TIMEOUT = 120.0


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: ARG002 - nothing but plain data is allowed
        raise pickle.UnpicklingError(f"refusing {module}.{name}: a flight-recorder dump holds plain data only")


def read_dump(path: Path) -> dict[str, Any]:
    """One rank's dump (raises ValueError when it is not a plain flight-recorder dump)."""
    try:
        data = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or "entries" not in data:
        raise ValueError(f"{path}: not a flight-recorder dump")
    return data


def read_folder(folder: Path) -> dict[int, dict[str, Any]]:
    """{rank: dump} of the ``rank_<N>`` files in ``folder``; unreadable ones are left out."""
    dumps = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if match := _RANK_FILE.match(path.name):
            try:
                dumps[int(match.group(1))] = read_dump(path)
            except ValueError:
                continue
    return dumps


@dataclass(frozen=True)
class Disagreement:
    group: str
    seq: int
    entered: list[int]
    missing: list[int]
    operation: str
    where: str | None
    missing_last: dict[int, int]

    def line(self) -> str:
        by = ", ".join(f"rank {r} (its last: #{self.missing_last[r]})" for r in self.missing)
        at = f" (from {self.where})" if self.where else ""
        return (f"process group {self.group}: collective #{self.seq} {self.operation}{at} was entered by "
                f"rank(s) {_ranks(self.entered)} but not by {by}")

    def short(self) -> str:
        """For a one-line summary."""
        return (f"rank(s) {_ranks(self.missing)} never entered collective #{self.seq} ({self.operation}) "
                f"that rank(s) {_ranks(self.entered)} wait in")


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks)


def _entry(dump: dict[str, Any], group: str, seq: int) -> dict[str, Any] | None:
    for entry in dump.get("entries", []):
        pg = entry.get("process_group") or ("", "")
        if str(pg[0]) == group and entry.get("collective_seq_id") == seq:
            return entry
    return None


def _describe(entry: dict[str, Any] | None) -> tuple[str, str | None]:
    if entry is None:
        return "(no longer in the buffer)", None
    sizes = entry.get("input_sizes")
    dtypes = entry.get("input_dtypes")
    operation = f"{entry.get('profiling_name', '?')} {sizes} {dtypes}" if sizes else str(entry.get("profiling_name"))
    frames = [{"function": f.get("name"), "file": f.get("filename", ""), "line": f.get("line")}
              for f in entry.get("frames") or []]
    user = next((f for f in frames if not is_library(f)), None)
    return operation, f"{short_where(user)} in {user['function']}" if user else None


def disagreements(dumps: dict[int, dict[str, Any]]) -> list[Disagreement]:
    """Per process group, the first collective that some ranks entered and others did not."""
    found = []
    groups = sorted({g for d in dumps.values() for g in (d.get("pg_status") or {})})
    for group in groups:
        last = {rank: int(d["pg_status"][group].get("last_enqueued_collective", -1))
                for rank, d in dumps.items() if group in (d.get("pg_status") or {})}
        if len(set(last.values())) < 2:
            continue
        seq = min(last.values()) + 1
        entered = sorted(r for r, n in last.items() if n >= seq)
        missing = sorted(r for r, n in last.items() if n < seq)
        operation, where = _describe(_entry(dumps[entered[0]], group, seq))
        found.append(Disagreement(group, seq, entered, missing, operation, where, {r: last[r] for r in missing}))
    return found


def mismatches(dumps: dict[int, dict[str, Any]]) -> list[str]:
    """Collectives that ranks entered under the same number with different operations or sizes."""
    lines = []
    groups = sorted({g for d in dumps.values() for g in (d.get("pg_status") or {})})
    for group in groups:
        seqs = sorted({e.get("collective_seq_id") for d in dumps.values() for e in d.get("entries", [])
                       if str((e.get("process_group") or ("",))[0]) == group and e.get("collective_seq_id")})
        for seq in seqs:
            seen = {}
            for rank, dump in dumps.items():
                entry = _entry(dump, group, seq)
                if entry is not None:
                    seen[rank] = (entry.get("profiling_name"), str(entry.get("input_sizes")))
            if len(set(seen.values())) > 1:
                shown = "; ".join(f"rank {r}: {name} {sizes}" for r, (name, sizes) in sorted(seen.items()))
                lines.append(f"process group {group}: collective #{seq} differs between ranks ({shown})")
                break  # the first one per group: what follows it is its consequence
    return lines


def torch_analyser(folder: Path) -> str | None:
    """torch's own fr_trace on ``folder``, when this machine's Python has torch; its output (or why not)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                               "-p", "rank_"], capture_output=True, text=True, timeout=ANALYSER_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"torch's analyser did not finish: {exc}"
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        last = (text.splitlines() or [f"exit {done.returncode}"])[-1]
        return f"torch's analyser failed on these dumps ({last}); its full output is kept beside them\n{text}"
    return text


def analyse(folder: Path) -> tuple[list[str], list[Disagreement]]:
    """Lines about one folder of dumps (one kind: nccl, cpu, on-timeout), and the disagreements found."""
    dumps = read_folder(folder)
    if not dumps:
        return [], []
    lines = [f"{folder.name}: dumps of rank(s) {_ranks(sorted(dumps))}"]
    found = disagreements(dumps)
    lines += [f"  {d.line()}" for d in found]
    lines += [f"  {line}" for line in mismatches(dumps)]
    if not found and len(lines) == 1:
        lines.append("  every rank entered the same collectives")
    return lines, found
