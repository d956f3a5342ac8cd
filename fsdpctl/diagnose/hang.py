"""What the hang watchdog does when a run stops making progress: read every rank's stack and its
flight recorder, keep them in ``runs/<id>/hang/``, name the odd rank, and say whether to end the run.

The follower (``launch``, ``logs -f``, ``submit --follow``) builds the watch with ``watch_for`` and
hands it to its backend's ``follow``; the backend only keeps the clock and acts on the verdict.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ..backends.hang_watch import HANG_EXIT, HangVerdict, HangWatch
from ..rundir.paths import private_dir, write_private
from ..rundir.state import Failure
from .flight import Disagreement, analyse, torch_analyser
from .stacks import group_stacks, rank_stacks, render, summary_line, suspect

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..rundir.rundir import RunDir

WORKLOAD_PROGRESS = re.compile(r"\bstep=\d+")
"""The bundled workload's progress: a logged step (training or validation)."""


def progress_pattern(run: RunDir) -> re.Pattern | None:
    """What counts as progress: for the bundled workload, a new step; for the user's program, any line."""
    return None if run.plan.command else WORKLOAD_PROGRESS


def watch_for(backend: Backend, run: RunDir, *, act: bool, echo: Callable[[str], None]) -> HangWatch | None:
    """The run's watchdog (None when its plan has no hang timeout). ``act``: this follower may end
    the run (the launcher of a foreground run, or a follower of a detached one); otherwise it reports."""
    plan = run.plan
    if not plan.hang_timeout:
        return None

    def on_hang(silent: float) -> HangVerdict:
        echo(f"fsdpctl: no progress for {silent:.0f} s (hang timeout {plan.hang_timeout} s); reading every "
             f"rank's stack and flight recorder")
        failure, lines = gather_hang(backend, run, silent)
        for line in lines:
            echo(line)
        stop = act and plan.on_hang == "stop"
        if stop:
            echo(f"fsdpctl: ending run {plan.run_id} (hang; exit {HANG_EXIT})")
        elif act:
            echo(f"fsdpctl: on_hang is keep: run {plan.run_id} goes on")
        return HangVerdict(stop, failure)

    return HangWatch(float(plan.hang_timeout), on_hang, progress_pattern(run))


def _new_folder(root: Path) -> Path:
    """``hang/`` for the first report of a run, ``hang-2/``... for later ones (``on_hang: keep``)."""
    folder, n = root / "hang", 1
    while folder.exists():
        n += 1
        folder = root / f"hang-{n}"
    private_dir(folder)
    return folder


REPORT = "report.json"
"""In a hang folder, written last: the failure and the lines shown, for every other follower of the run."""


@contextlib.contextmanager
def _one_reader(root: Path) -> Iterator[None]:
    """Held while a process reads a run's stacks or flight recorder: a detached run's follower and
    every ``logs -f`` on it watch the same silence, and the nodes are read once for all of them
    (their copies of the dumps in ``fetched/`` are not pulled from under each other either)."""
    fd = os.open(root / ".hang.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # lets the lock go


def _shared_report(root: Path, since: float) -> tuple[Failure, list[str]] | None:
    """The report another follower began at or after ``since`` (epoch seconds), if there is one."""
    newest: tuple[float, Failure, list[str]] | None = None
    for folder in root.glob("hang*"):
        try:
            data = json.loads((folder / REPORT).read_text())
            began, failure = float(data["began"]), Failure.from_json(data["failure"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if began >= since and failure is not None and (newest is None or began > newest[0]):
            newest = (began, failure, [str(line) for line in data.get("lines", [])])
    return None if newest is None else newest[1:]


def gather_hang(backend: Backend, run: RunDir, silent: float) -> tuple[Failure, list[str]]:
    """Stacks and flight-recorder dumps into a new ``hang/`` folder; (the failure to record, lines to
    show). Another follower's report of the same silence (begun within half the hang timeout before
    this one fired, or after) is taken as it is instead of reading the nodes again."""
    fired = time.time()
    with _one_reader(run.root):
        shared = _shared_report(run.root, fired - float(run.plan.hang_timeout or 0) / 2)
        if shared is not None:
            return shared
        failure, lines = _gather(backend, run, silent)
        write_private(Path(failure.hang_dir or run.root) / REPORT,
                      json.dumps({"began": fired, "failure": failure.to_json(), "lines": lines}) + "\n")
        return failure, lines


def _gather(backend: Backend, run: RunDir, silent: float) -> tuple[Failure, list[str]]:
    folder = _new_folder(run.root)
    nodes = backend.stacks(run, flight=True, native=True)  # once per hang: every frame there is
    stacks = rank_stacks(nodes)
    groups = group_stacks(stacks)
    report = render(groups, nodes)
    write_private(folder / "stacks.json", json.dumps(nodes, indent=1) + "\n")
    flight_lines, disagree = collect_flight(backend, run, folder / "flight")
    write_private(folder / "stacks.txt", "\n".join(report + ([""] + flight_lines if flight_lines else [])) + "\n")
    where = summary_line(groups) + (f"; flight recorder: {disagree[0].short()}" if disagree else "")
    # The one rank to look at: the odd one of the stacks, else the one the flight recorder finds behind.
    odd = suspect(groups)
    behind = disagree[0].missing if disagree else []
    named = (odd.members[0] if odd and len(odd.members) == 1
             else next((s for s in stacks if [s.rank] == behind), None))
    failure = Failure(kind="hang", detail=f"no progress for {silent:.0f} s (hang timeout {run.plan.hang_timeout} s); "
                                          f"{where}", hang_dir=str(folder), exit_code=HANG_EXIT,
                      rank=named.rank if named else None, host=named.host if named else None,
                      node_rank=named.node_rank if named else None)
    lines = [f"fsdpctl: stacks of run {run.plan.run_id}:", *(f"  {line}" for line in report)]
    if flight_lines:
        lines += ["fsdpctl: flight recorder:", *(f"  {line}" for line in flight_lines)]
    lines.append(f"fsdpctl: kept in {folder}")
    return failure, lines


def flight_after_failure(backend: Backend, run: RunDir, echo: Callable[[str], None],
                         fetched: Optional[dict[str, list[str]]] = None) -> None:
    """After a failed run: the dumps torch's NCCL watchdog wrote when a collective timed out
    (``flight/on-timeout/`` on the nodes), brought to ``runs/<id>/flight/`` and read. ``fetched``:
    the dumps already copied as the nodes ended (the follower's), by node; none are fetched again."""
    with _one_reader(run.root):
        lines, _ = collect_flight(backend, run, run.root / "flight", "flight/on-timeout", fetched)
    if lines:
        echo("fsdpctl: flight recorder, dumped by torch when the collective timed out:")
        for line in lines:
            echo(f"  {line}")
        echo(f"fsdpctl: kept in {run.root / 'flight'}")


def collect_flight(backend: Backend, run: RunDir, into: Path, path: str = "flight",
                   fetched: Optional[dict[str, list[str]]] = None) -> tuple[list[str], list[Disagreement]]:
    """Every rank's flight-recorder dumps under ``path``, one folder per kind (``rank_<N>`` files, ranks
    being global), each read for the collective the ranks disagree on: (lines to show, what they
    disagree on). ``fetched``: the files already here, by node (``backend.fetch``'s answer)."""
    fetched_here = (run.root / "fetched").resolve()
    for files in (fetched if fetched is not None else backend.fetch(run, path)).values():
        for name in files:
            dump = Path(name)
            if not dump.name.startswith("rank_") or dump.name.endswith(".tmp"):
                continue
            target = into / dump.parent.name / dump.name
            private_dir(target.parent)
            if target.resolve() != dump.resolve():  # a local run's own files are already in place
                shutil.copyfile(dump, target)
                target.chmod(0o600)
            if fetched_here in dump.resolve().parents:
                dump.unlink(missing_ok=True)  # only carried here to be kept with the run
    lines: list[str] = []
    found: list[Disagreement] = []
    kinds = sorted(p for p in into.iterdir() if p.is_dir()) if into.is_dir() else []
    for kind in kinds:
        if not any(kind.glob("rank_*")):
            continue  # a folder torch made and never wrote into (a local run's own directory)
        kind_lines, kind_found = analyse(kind)
        lines += kind_lines
        found += kind_found
        theirs = torch_analyser(kind)
        if theirs is not None:
            write_private(kind / "fr_trace.txt", theirs + "\n")
            lines.append(f"  torch's fr_trace: {theirs.splitlines()[0] if theirs else 'no output'} "
                         f"(all of it: {kind / 'fr_trace.txt'})")
    return lines, found
