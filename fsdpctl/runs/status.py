"""How a run stands: its record, refreshed from the nodes while it is marked running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..backends.node_commands import poll_command
from ..backends.supervisor import COMMAND_TIMEOUT
from ..errors import HostError
from ..shell import after_mark, marked, quote_path


def run_status(run_dir: Path) -> dict[str, Any]:
    """run.json, with each node's state asked from the node while the run is marked running,
    and the last metrics line rank 0 wrote."""
    from ..backends.connect import close_all, open_transports
    from .record import load_run

    plan, profile, record = load_run(run_dir)
    if record.get("backend") == "slurm":
        return _slurm_status(run_dir, plan, record)
    nodes = record.get("nodes") or [{"node_rank": n.node_rank, "host": n.host, "state": "unknown",
                                     "exit_code": None, "pid": 0} for n in plan.nodes]
    info: dict[str, Any] = {"run_id": plan.run_id, "state": record.get("state", "unknown"), "nodes": nodes,
                            "first_failure": record.get("first_failure"), "exit_code": record.get("exit_code")}
    live = info["state"] in ("running", "starting")
    transports = open_transports(profile) if live else []
    try:
        if live:
            for node, transport in zip(nodes, transports, strict=True):
                try:
                    _, out, _ = transport.run(marked(poll_command(plan.run_dir, node["node_rank"],
                                                                  node.get("pid", 0))), COMMAND_TIMEOUT)
                    out = after_mark(out)
                except HostError as exc:
                    node["state"], node["detail"] = "unreachable", exc.detail
                    continue
                words = out.split()
                if words[:1] == ["exit"] and len(words) == 2:
                    node["exit_code"] = int(words[1])
                    node["state"] = "succeeded" if node["exit_code"] == 0 else "failed"
                else:
                    node["state"] = "running" if words[:1] == ["running"] else "gone"
            states = {n["state"] for n in nodes}
            info["state"] = ("running" if "running" in states else "failed" if states - {"succeeded"}
                             else "succeeded")
        info["last_metrics"] = _last_metrics(run_dir, plan, transports)
    finally:
        close_all(transports)
    return info


def _slurm_status(run_dir: Path, plan, record: dict[str, Any]) -> dict[str, Any]:
    """A Slurm run: the job's state from Slurm (squeue, then scontrol), each node from its log."""
    from ..backends.slurm.client import job_state
    from ..backends.slurm.logs import NodeLogs

    info: dict[str, Any] = {"run_id": plan.run_id, "state": record.get("state"), "job_id": record.get("job_id"),
                            "exit_code": record.get("exit_code"), "first_failure": None}
    if record.get("state") in ("submitted", "running"):
        state = job_state(record["job_id"], requeueable=bool(plan.slurm and plan.slurm.requeue))
        info["slurm_state"] = state.state
        info["restarts"] = state.restarts  # how often Slurm requeued it (preemption, --requeue)
        info["state"] = "running" if not state.finished else (
            "succeeded" if state.state == "COMPLETED" and not state.exit_code else "failed")
        info["exit_code"] = state.exit_code
    logs = NodeLogs(Path(plan.run_dir).expanduser(), plan.num_nodes)
    logs.read_new(lambda rank, host, line: None)
    info["nodes"] = [{"node_rank": rank, "host": logs.hosts[rank], "state": info["state"],
                      "exit_code": info["exit_code"]} for rank in range(plan.num_nodes)]
    info["last_metrics"] = _last_metrics(run_dir, plan, [])
    return info


def _last_metrics(run_dir: Path, plan, transports) -> dict[str, Any] | None:
    """The newest metrics.jsonl line: from this machine when the run directory is here, else the nodes."""
    local = Path(plan.run_dir).expanduser() / "metrics.jsonl"
    texts = [local.read_text(encoding="utf-8")] if local.exists() else []
    for transport in transports:
        try:
            _, out, _ = transport.run(marked(f"tail -n 1 {quote_path(plan.run_dir)}/metrics.jsonl 2>/dev/null"), 30)
            texts.append(after_mark(out))
        except HostError:
            continue
    for text in texts:
        for line in reversed(text.strip().splitlines()):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if "loss" in data:
                return data
    return None
