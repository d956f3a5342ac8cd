"""The node protocol: the commands that stage and start, follow, poll and end a node's part of a run.

On every node the run lives in ``<run_dir>`` (``<workdir>/runs/<run_id>``):

- staged and started by one command, the node agent (``node_agent``, sent with the probe's source as
  ``python -c``): it unpacks the tar the launcher writes on its stdin (the node scripts, the
  workload package ``pkg/``, the user's code ``code/``), answers the preflight probe, waits for the
  launcher's word, and starts ``node<R>.sh`` in a session of its own (a dropped connection does not
  end it); the wrapper writes ``node<R>.pid`` and, when the script ends, ``node<R>.exit``;
- followed with ``tail -F --pid`` on ``node<R>.log``, and polled for its exit file; a poll that
  fails means the host stopped answering;
- asked for every rank's stack (``fsdpctl.node.stacks``: py-spy where the node has it, else the
  dump handler fsdpctl's start-up hook installed in each rank), and for flight-recorder dumps;
- ended by signalling exactly the processes whose environment carries this run's
  ``FSDPCTL_RUN_ID`` (torchrun puts its workers in sessions of their own, so a process-group kill
  would miss them): TERM, a grace period, then KILL.

Local and SSH nodes run the same commands; only the transport differs.
"""

from __future__ import annotations

import functools
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from ...container.runtime import cleanup_command
from ...hostcheck.probe import probe_source
from ...shell import command_line, marked, quote_path
from .agent import AGENT_REFUSED, AGENT_STARTED, STOP_MARKER

__all__ = ["AGENT_REFUSED", "AGENT_STARTED", "agent_command"]


@dataclass(frozen=True)
class Data:
    """Bytes of the node's log, in order."""

    chunk: bytes


@dataclass(frozen=True)
class Note:
    """fsdpctl's own word about the node (shown and kept; not the node's log)."""

    text: str


@dataclass(frozen=True)
class SideData:
    """Bytes of one of the node's side files (``fsdpctl.node.side_files``): the ``index``-th of its
    list, from ``offset`` of the file ``inode``."""

    index: int
    inode: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class SideEnded:
    """The node's side files reader ended (everything it had is out)."""


@dataclass(frozen=True)
class StreamEnded:
    """The node's log stream ended."""


@dataclass(frozen=True)
class Exited:
    """The node's script ended with this exit status."""

    code: int


@dataclass(frozen=True)
class Running:
    """The node's script is still running."""


@dataclass(frozen=True)
class Gone:
    """The node's script's wrapper vanished without an exit status."""


@dataclass(frozen=True)
class Lost:
    """The node stopped answering."""

    why: str


Answer = Union[Exited, Running, Gone, Lost]
"""What is known of how a node's script stands."""
Message = Union[Data, SideData, SideEnded, Note, StreamEnded, Answer]
"""What a feed hands the supervisor about one node."""


_MAIN = '\nif __name__ == "__main__":'


@functools.lru_cache(maxsize=1)
def agent_source() -> str:
    """The probe's functions, then the agent's (it answers the preflight with the probe's own code),
    then its watch over a foreground run (``agent_watch``), then the agent's main guard."""
    probe, guard, _ = probe_source().rpartition(_MAIN)
    here = Path(__file__).resolve().parent
    agent, agent_guard, main = (here / "agent.py").read_text(encoding="utf-8").rpartition(_MAIN)
    if not guard or not agent_guard:
        raise AssertionError("the probe script or the agent lost its main guard")
    watch = (here / "agent_watch.py").read_text(encoding="utf-8")
    return "\n\n".join((probe, agent, watch)) + _MAIN + main


def agent_command(python: str, args: dict[str, Any]) -> str:
    """The shell command line that runs the node agent with the node's ``python``."""
    return command_line(python, ["-c", agent_source(), json.dumps(args, sort_keys=True)])


def follow_command(run_dir: str, rank: int, pid: int, start: int = 0) -> str:
    """Print node<R>.log from byte ``start`` (its start by default), and keep following it until the
    wrapper ends."""
    return marked(f"cd {quote_path(run_dir)} && exec tail -c +{start + 1} -F --pid={pid} node{rank}.log 2>/dev/null")


def side_files_command(run_dir: str, python: str, rank: int, pid: int, specs: list[dict[str, Any]]) -> str:
    """Send what the node's side files gain, as frames, until the node has ended and all is out
    (``fsdpctl.node.side_files``, shipped with the run): for a follower of a run it did not start."""
    args = json.dumps({"files": specs, "rank": rank, "pid": pid}, sort_keys=True)
    return marked(f"cd {quote_path(run_dir)} && PYTHONPATH=pkg exec {quote_path(python)} "
                  f"-m fsdpctl.node.side_files {shlex.quote(args)}")


def poll_command(run_dir: str, rank: int, pid: int) -> str:
    """``exit <code>`` once the node's script ended, ``running`` while its wrapper lives, else ``gone``."""
    return (f"cd {quote_path(run_dir)} 2>/dev/null && "
            f"if [ -s node{rank}.exit ]; then echo exit $(cat node{rank}.exit); "
            f"elif kill -0 {pid} 2>/dev/null; then echo running; else echo gone; fi")


def parse_poll(text: str) -> Exited | Running | Gone:
    """The node's word on its script, as ``poll_command`` (or the agent's ``!exit N``) says it:
    ``exit N``, ``running``, or anything else: its wrapper is gone. The one reader of the reply."""
    words = text.strip().split()
    if words[:1] == ["exit"]:
        code = words[1] if len(words) == 2 else ""
        # An exit file cut short or garbled still says the script ended: as a lost node's, 255.
        return Exited(int(code) if code.lstrip("-").isdigit() else 255)
    return Running() if words[:1] == ["running"] else Gone()


def kill_command(run_id: str, grace: float, runtime: str | None = None, first: str | None = None,
                 run_dir: str | None = None) -> str:
    """Signal every process of the run (by its FSDPCTL_RUN_ID), TERM then KILL; print what remained.
    ``runtime``: the run's containers (docker, podman) are then removed too, by their run label.
    ``first``: a signal's name that the ranks alone get first (processes with ``LOCAL_RANK`` whose
    parent has none: not torchrun, nor a rank's own children), with ``grace`` seconds to exit by
    themselves (and torchrun with them); then TERM to what is left, 2 s, KILL (the agent's ``end_run``
    does the same). Before it, ``STOP_MARKER`` is left in ``run_dir``: the ranks read that the stop was
    asked for."""
    # One grep over every process's environment, not one per process: on a loaded node a grep per
    # process took seconds a round, and the rounds of the grace below ran far past it.
    find = (f'ps=$(grep -lsxzF "FSDPCTL_RUN_ID={run_id}" /proc/[0-9]*/environ 2>/dev/null | '
            "sed -n 's,^/proc/\\([0-9]*\\)/environ$,\\1,p' | tr '\\n' ' '); ps=${ps% }")
    steps = max(1, int(grace * 10))
    ranks = ""
    if first:
        is_rank = "grep -qszE '^LOCAL_RANK=' /proc/$1/environ"
        marker = f"touch {quote_path(run_dir)}/{STOP_MARKER} 2>/dev/null; " if run_dir else ""
        ranks = (f"{marker}is_rank() {{ {is_rank}; }}; roots=; for p in $ps; do is_rank $p || continue; "
                 "pp=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status 2>/dev/null); "
                 "is_rank \"${pp:-0}\" || roots=\"$roots $p\"; done; "
                 f"[ -n \"$roots\" ] && kill -{shlex.quote(first)} $roots 2>/dev/null; "
                 # the ranks save and leave; torchrun then sees them done and ends too (not waited for:
                 # what a rank leaves behind, a data loader worker that outlives it)
                 f"[ -n \"$roots\" ] && for _ in $(seq {steps}); do {find}; left=; for p in $ps; do "
                 "if is_rank $p; then case \" $roots \" in *\" $p \"*) left=1;; esac; else left=1; fi; done; "
                 "[ -z \"$left\" ] && break; sleep 0.1; done; "
                 f"{find}; ")
        steps = min(steps, 20)
    return (f"{find}; {ranks}[ -n \"$ps\" ] && kill -TERM $ps 2>/dev/null; "
            f"for _ in $(seq {steps}); do {find}; [ -z \"$ps\" ] && break; sleep 0.1; done; "
            f"[ -n \"$ps\" ] && kill -KILL $ps 2>/dev/null; sleep 0.2; {find}; "
            f"{cleanup_command(runtime, run_id) + '; ' if runtime else ''}echo \"remaining:$ps\"")


def stacks_command(run_dir: str, run_id: str, python: str, node_rank: str, *, flight: bool, py_spy: bool,
                   native: bool, inside: tuple[str, str, str] | None = None) -> str:
    """Every rank of node ``node_rank`` (a shell word: a number, or ``"$SLURM_NODEID"``), as one JSON
    line (``fsdpctl.node.stacks``, shipped with the run). ``inside``: (runtime, container, the image's
    Python): read inside the node's container while it runs (the image's py-spy), else on the host."""
    flags = (" --flight" if flight else "") + ("" if py_spy else " --no-py-spy") + (" --native" if native else "")
    return rank_command("fsdpctl.node.stacks", run_dir, run_id, python, node_rank, flags, inside)


def profile_request_command(run_dir: str, run_id: str, python: str, node_rank: str, *, ranks: str, request: str,
                            inside: tuple[str, str, str] | None = None) -> str:
    """Hand a profile request to the chosen ranks of node ``node_rank`` (``fsdpctl.node.profile_request``)."""
    flags = f" --ranks {shlex.quote(ranks)} --request {shlex.quote(request)}"
    return rank_command("fsdpctl.node.profile_request", run_dir, run_id, python, node_rank, flags, inside)


def rank_command(module: str, run_dir: str, run_id: str, python: str, node_rank: str, flags: str,
                 inside: tuple[str, str, str] | None) -> str:
    """``python -m module RUN_ID "$PWD" --node-rank N flags`` in the node's run directory, with the
    run's copy of fsdpctl: on the host, or inside the node's container while it runs."""
    reader = f"-m {module} {shlex.quote(run_id)} \"$PWD\" --node-rank {node_rank}{flags}"
    host = f"PYTHONPATH=pkg {quote_path(python)} {reader}"
    if inside is None:
        return f"cd {quote_path(run_dir)} && {host}"
    runtime, name, image_python = inside
    return (f"cd {quote_path(run_dir)} && if {runtime} exec {name} true >/dev/null 2>&1; then "
            f"{runtime} exec -w \"$PWD\" -e PYTHONPATH=\"$PWD\"/pkg {name} {quote_path(image_python)} {reader}; "
            f"else {host}; fi")


FETCH_MISSING = "fsdpctl: no such file"
STAGED = ("pkg", "code")
"""What fsdpctl itself put in a run directory (copies of the workload and the code): never fetched back."""


def fetch_command(run_dir: str, *paths: str) -> str:
    """The ``paths`` that exist (relative to the run directory) as one base64 tar.gz (the transports
    carry text), or a line saying none is there."""
    return (f"cd {quote_path(run_dir)} && set -- && for p in {' '.join(shlex.quote(p) for p in paths)}; do "
            f'if [ -e "$p" ]; then set -- "$@" "$p"; fi; done; if [ $# -gt 0 ]; then '
            f"tar -czf - {' '.join(f'--exclude=./{name}' for name in STAGED)} --exclude='./.stage.*' "
            f'-- "$@" | base64 -w0; '
            f"else echo '{FETCH_MISSING}'; fi")
