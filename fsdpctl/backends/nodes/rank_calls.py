"""Calls into a live run's ranks on every node at once, over the nodes' connections: their stacks, a
profile request, and each node's clock against this machine's."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ...container.runtime import DAEMON_RUNTIMES, container_name
from ...errors import HostError
from ...node import profile_request, stacks
from ...plan.types import LaunchPlan
from ...rundir.rundir import RunDir
from ...shell import after_mark, marked
from .commands import profile_request_command, stacks_command

CALL_TIMEOUT = 60.0
CLOCK_SAMPLES = 3
"""Round trips per node for its clock; the shortest one's middle is taken (as NTP does)."""


def inside(plan: LaunchPlan, node: Any) -> tuple[str, str, str] | None:
    """Where a node's rank reader runs inside its container (docker, podman): (runtime, name, python)."""
    if plan.container is None or plan.container.runtime not in DAEMON_RUNTIMES:
        return None  # apptainer shares the host's process table: read from the host
    return plan.container.runtime, container_name(plan.run_id, node.node_rank, plan.attempt), plan.python


def on_every_node(backend: Any, run: RunDir, command_of: Callable[[Any], str], read: Callable[[str], dict],
                  what: str) -> list[dict[str, Any]]:
    """``command_of(node)`` on every node of the run at once; each node's answer, ``read`` from its
    output, with ``host`` and ``node_rank`` (``error`` where it gave none)."""
    def one(node: Any) -> dict[str, Any]:
        try:
            status, out, err = backend.connection(node).run(marked(command_of(node)), CALL_TIMEOUT)
            found = read(after_mark(out))
        except HostError as exc:
            return {"host": node.host, "node_rank": node.node_rank, "ranks": [], "error": exc.detail}
        except ValueError:
            why = (err.strip().splitlines() or [f"exit {status}"])[-1]
            return {"host": node.host, "node_rank": node.node_rank, "ranks": [], "error": f"{what} failed: {why}"}
        return {**found, "hostname": found.get("host"), "host": node.host, "node_rank": node.node_rank}

    return backend._parallel(one, list(run.plan.nodes))


def node_stacks(backend: Any, run: RunDir, *, flight: bool, py_spy: bool, native: bool) -> list[dict[str, Any]]:
    plan = run.plan
    return on_every_node(backend, run, lambda node: stacks_command(
        plan.run_dir, plan.run_id, plan.host_python, str(node.node_rank), flight=flight, py_spy=py_spy, native=native,
        inside=inside(plan, node)), stacks.answer_of, "the stack reader")


def node_profile_request(backend: Any, run: RunDir, request: str, ranks: str) -> list[dict[str, Any]]:
    plan = run.plan
    return on_every_node(backend, run, lambda node: profile_request_command(
        plan.run_dir, plan.run_id, plan.host_python, str(node.node_rank), ranks=ranks, request=request,
        inside=inside(plan, node)), profile_request.answer_of, "the profile request")


def clock_offsets(backend: Any, run: RunDir) -> dict[str, dict[str, Any]]:
    """Per host, its clock minus this machine's (``offset_ns``), and how far that can be off
    (``error_ns``: half the shortest round trip); ``error`` where the node did not answer."""
    def one(node: Any) -> tuple[str, dict[str, Any]]:
        best: tuple[int, int] | None = None
        try:
            connection = backend.connection(node)
            for _ in range(CLOCK_SAMPLES):
                sent = time.time_ns()
                _, out, _ = connection.run(marked("date +%s%N"), CALL_TIMEOUT)
                back = time.time_ns()
                theirs = int(after_mark(out).strip().splitlines()[-1])
                if best is None or back - sent < best[1]:
                    best = (theirs - (sent + back) // 2, back - sent)
        except (HostError, ValueError, IndexError) as exc:
            return node.host, {"error": str(getattr(exc, "detail", exc))}
        return node.host, {"offset_ns": best[0], "error_ns": best[1] // 2}

    return dict(backend._parallel(one, list(run.plan.nodes)))
