"""Start the node scripts of a plan, stream their output, and tear everything down on failure.

One process group per node (started through a Transport); the first node to exit non-zero, or a
Ctrl-C, ends every other node (TERM, a grace period, then KILL). The run's local directory gets
``plan.json``, the scripts, ``run.json`` (process ids, state, exit codes, first failure) and one
merged log.
"""

from __future__ import annotations

import datetime as _dt
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .plan import LaunchPlan
from .runs import RunPaths, write_json_atomic
from .transport import KILL, TERMINATE, NodeProcess, Transport

GRACE_SECONDS = 10.0
TAIL_LINES = 20
LineSink = Callable[[int, str, str], None]  # (node rank, host, line)


@dataclass
class NodeState:
    """What is known about one node while the run goes on."""

    node_rank: int
    host: str
    process: NodeProcess
    exit_code: int | None = None
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))


@dataclass(frozen=True)
class RunResult:
    """How the run ended: exit code (the job's), and the first failing node if any."""

    exit_code: int
    first_failure: dict[str, Any] | None
    interrupted: bool


def _now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _record(plan: LaunchPlan, states: Sequence[NodeState], state: str, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": plan.run_id, "profile": plan.profile_name, "backend": plan.backend, "state": state,
        "run_dir_on_nodes": plan.run_dir,
        "nodes": [{"node_rank": s.node_rank, "host": s.host, "pid": s.process.pid, "pgid": s.process.pgid,
                   "exit_code": s.exit_code, "log_dir": f"{plan.run_dir}/logs/node{s.node_rank}"} for s in states],
        **extra,
    }


def prepare_run_dir(plan: LaunchPlan, scripts: dict[str, str], paths: RunPaths) -> None:
    """Write the plan and the rendered scripts into the local run directory."""
    write_json_atomic(paths.plan, plan.to_json())
    paths.scripts.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        paths.script(name).write_text(text, encoding="utf-8")
    paths.logs.mkdir(parents=True, exist_ok=True)


def start_nodes(plan: LaunchPlan, scripts: dict[str, str], transports: Sequence[Transport]) -> list[NodeState]:
    """Write every node's script onto its node, then start them all."""
    for node, transport in zip(plan.nodes, transports, strict=True):
        transport.write_file(node.script_path, scripts[f"node{node.node_rank}.sh"], mode=0o755)
    return [NodeState(node.node_rank, node.host, transport.start(["bash", node.script_path]))
            for node, transport in zip(plan.nodes, transports, strict=True)]


def teardown(states: Sequence[NodeState], transports: Sequence[Transport], grace: float = GRACE_SECONDS) -> None:
    """TERM every node's process group still running, wait up to ``grace`` seconds, then KILL."""
    live = [(s, t) for s, t in zip(states, transports, strict=True) if s.process.poll() is None]
    for state, transport in live:
        transport.signal_group(state.process.pgid, TERMINATE)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(s.process.poll() is None for s, _ in live):
        time.sleep(0.1)
    for state, transport in live:
        # The group may outlive its leader (workers still exiting): KILL the group regardless.
        transport.signal_group(state.process.pgid, KILL)
        state.process.wait()


def _exit_status(returncode: int) -> int:
    """A shell-style exit status: a process killed by signal N reads as 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _pump(state: NodeState, lines: queue.Queue) -> None:
    for line in state.process.lines:
        lines.put((state, line))
    lines.put((state, None))


def supervise(plan: LaunchPlan, states: list[NodeState], transports: Sequence[Transport], paths: RunPaths,
              sink: LineSink, grace: float = GRACE_SECONDS) -> RunResult:
    """Stream every node's lines to ``sink`` and the merged log until all nodes end; fail fast."""
    write_json_atomic(paths.run_record, _record(plan, states, "running", started_at=_now()))
    lines: queue.Queue = queue.Queue()
    for state in states:
        threading.Thread(target=_pump, args=(state, lines), daemon=True).start()
    open_streams = len(states)
    first_failure: dict[str, Any] | None = None
    interrupted = False
    with (paths.logs / "merged.log").open("a", encoding="utf-8") as merged:
        try:
            while open_streams:
                state, line = lines.get()
                if line is None:
                    open_streams -= 1
                    state.exit_code = _exit_status(state.process.wait())
                    if state.exit_code != 0 and first_failure is None:
                        first_failure = {"node_rank": state.node_rank, "host": state.host,
                                         "exit_code": state.exit_code, "last_lines": list(state.tail)}
                        teardown(states, transports, grace)
                    continue
                state.tail.append(line)
                merged.write(f"[{state.host} r{state.node_rank}] {line}\n")
                merged.flush()
                sink(state.node_rank, state.host, line)
        except KeyboardInterrupt:
            interrupted = True
            teardown(states, transports, grace)
            for state in states:
                state.exit_code = _exit_status(state.process.wait())
    if interrupted:
        exit_code = 130
    elif first_failure is not None:
        exit_code = first_failure["exit_code"]
    else:
        exit_code = 0
    final = "interrupted" if interrupted else ("failed" if exit_code else "succeeded")
    write_json_atomic(paths.run_record, _record(plan, states, final, finished_at=_now(), exit_code=exit_code,
                                                first_failure=first_failure))
    return RunResult(exit_code=exit_code, first_failure=first_failure, interrupted=interrupted)
