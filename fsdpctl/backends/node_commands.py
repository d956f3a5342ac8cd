"""The node protocol: the shell commands that stage, start, follow, poll and end a node's part of a run.

On every node the run lives in ``<run_dir>`` (``<workdir>/runs/<run_id>``):

- staged with one command: a tar of ``node<R>.sh`` and the workload package (``pkg/``), so a node
  needs only Python with the packages the workload imports (doctor checks them);
- started detached in a session of its own (``setsid``): a dropped connection does not end it;
  the wrapper writes ``node<R>.pid`` and, when the script ends, ``node<R>.exit``;
- followed with ``tail -F --pid`` on ``node<R>.log``, and polled for its exit file; a poll that
  fails means the host stopped answering;
- ended by signalling exactly the processes whose environment carries this run's
  ``FSDPCTL_RUN_ID`` (torchrun puts its workers in sessions of their own, so a process-group kill
  would miss them): TERM, a grace period, then KILL.

Local and SSH nodes run the same commands; only the transport differs.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from ..plan.make import SHIPPED_PACKAGE_DIR
from ..shell import marked, quote_path

# The fsdpctl package folder: the workload package is shipped from it.
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def workload_bundle(script_name: str, script: str) -> bytes:
    """A tar.gz of the node script and the workload package (``pkg/fsdpctl/workload/*.py``)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))

        add(script_name, script.encode(), 0o755)
        add(f"{SHIPPED_PACKAGE_DIR}/fsdpctl/__init__.py", (_PACKAGE_ROOT / "__init__.py").read_bytes())
        for source in sorted((_PACKAGE_ROOT / "workload").glob("*.py")):
            add(f"{SHIPPED_PACKAGE_DIR}/fsdpctl/workload/{source.name}", source.read_bytes())
    return buffer.getvalue()


def stage_command(run_dir: str, script_name: str) -> str:
    # Nodes may share the run directory (a home on NFS): unpack privately, then rename into place;
    # the package is renamed only by the first node (the same files: the same launcher wrote them).
    return (f"mkdir -p {quote_path(run_dir)} && cd {quote_path(run_dir)} && t=$(mktemp -d .stage.XXXXXX) && "
            f"tar -xzf - -C \"$t\" && mv -f \"$t/{script_name}\" . && "
            f"{{ mv -T \"$t/{SHIPPED_PACKAGE_DIR}\" {SHIPPED_PACKAGE_DIR} 2>/dev/null || true; }} && rm -rf \"$t\"")


def start_command(run_dir: str, rank: int) -> str:
    # setsid in a background job (no job control: not a group leader) makes the wrapper a session
    # leader in place, so its pid is also its process group and session id.
    wrapper = (f"echo $$ > node{rank}.pid; bash node{rank}.sh > node{rank}.log 2>&1; "
               f"echo $? > node{rank}.exit.tmp; mv node{rank}.exit.tmp node{rank}.exit")
    # `setsid ... &` must stay a simple command: a backgrounded `a && b` list would run in a
    # subshell that keeps this command's output open until the job ends.
    return (f"cd {quote_path(run_dir)} || exit 1; rm -f node{rank}.pid node{rank}.exit; "
            f"setsid bash -c '{wrapper}' < /dev/null > /dev/null 2>&1 & "
            f"for _ in $(seq 200); do [ -s node{rank}.pid ] && break; sleep 0.01; done; cat node{rank}.pid")


def follow_command(run_dir: str, rank: int, pid: int) -> str:
    """Print node<R>.log from its start, and keep following it until the wrapper ends."""
    return marked(f"cd {quote_path(run_dir)} && exec tail -n +1 -F --pid={pid} node{rank}.log 2>/dev/null")


def poll_command(run_dir: str, rank: int, pid: int) -> str:
    """``exit <code>`` once the node's script ended, ``running`` while its wrapper lives, else ``gone``."""
    return (f"cd {quote_path(run_dir)} 2>/dev/null && "
            f"if [ -s node{rank}.exit ]; then echo exit $(cat node{rank}.exit); "
            f"elif kill -0 {pid} 2>/dev/null; then echo running; else echo gone; fi")


def kill_command(run_id: str, grace: float) -> str:
    """Signal every process of the run (by its FSDPCTL_RUN_ID), TERM then KILL; print what remained."""
    find = (f'ps=""; for p in /proc/[0-9]*; do grep -qsxz "FSDPCTL_RUN_ID={run_id}" "$p/environ" && '
            f'ps="$ps ${{p#/proc/}}"; done')
    steps = max(1, int(grace * 10))
    return (f"{find}; [ -n \"$ps\" ] && kill -TERM $ps 2>/dev/null; "
            f"for _ in $(seq {steps}); do {find}; [ -z \"$ps\" ] && break; sleep 0.1; done; "
            f"[ -n \"$ps\" ] && kill -KILL $ps 2>/dev/null; sleep 0.2; {find}; echo \"remaining:$ps\"")


def fetch_logs_command(run_dir: str, rank: int) -> str:
    # base64: the transports carry text
    return f"cd {quote_path(run_dir)} && {{ tar -czf - logs/node{rank} 2>/dev/null | base64 -w0; }}"
