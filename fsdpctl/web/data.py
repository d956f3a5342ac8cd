"""What the dashboard's pages show, as JSON-ready data, made from what ``fsdpctl.live`` and the API read
here (run directories, the registry, the profile's hosts): nothing in this module asks a node.

``RunsIndex`` keeps the registry's rows, re-reading a run only when its record or metrics changed
(1,000 runs: a few thousand stat calls per look). ``run_page`` is one run: its snapshot, plan and
scripts; its charts come from ``fsdpctl.live.charts`` (``hub``). ``hosts_page`` is a profile's hosts
with the last doctor's findings and each host's straggler count across runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

from ..live import layout
from ..metrics.gpu_samples import newest_text
from ..rundir.record import epoch
from ..rundir.rundir import last_metrics

TAIL_BYTES = 16 << 10
"""Of a run's metrics, what the runs page reads for its newest step, loss and tokens/s."""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


class RunsIndex:
    """The registry as the runs page shows it, kept up to date cheaply."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = runs_dir
        self.rows: dict[str, tuple[tuple[float, ...], dict[str, Any]]] = {}

    def listing(self) -> list[dict[str, Any]]:
        """Every run, newest first."""
        from ..rundir.paths import list_runs

        seen = set()
        out = []
        for path in reversed(list_runs(self.runs_dir)):
            seen.add(path.name)
            stamp = (_mtime(path / "run.json"), _mtime(path / "plan.json"), *self._metrics_mtimes(path))
            cached = self.rows.get(path.name)
            if cached is None or cached[0] != stamp:
                try:
                    row = run_row(path)
                except (OSError, ValueError, KeyError, TypeError):
                    continue  # a run being created, or a directory that is not one
                cached = self.rows[path.name] = (stamp, row)
            out.append(cached[1])
        for gone in set(self.rows) - seen:
            del self.rows[gone]
        return out

    @staticmethod
    def _metrics_mtimes(path: Path) -> list[float]:
        found = [_mtime(path / "metrics.jsonl")]
        live = path / layout.LIVE
        if live.is_dir():
            found += [_mtime(p) for p in sorted(live.glob("node*/metrics.jsonl"))]
        return found


class _PlanFiles:
    """What ``layout`` reads of a plan, from plan.json as it is (a row needs no profile parsed)."""

    def __init__(self, data: dict[str, Any]):
        self.run_dir = str(data.get("run_dir") or "")
        self.shared_run_dir = bool(data.get("shared_run_dir"))
        self.num_nodes = int(data.get("num_nodes") or 0)
        self.nodes = [_Node(int(n.get("node_rank", 0))) for n in data.get("nodes") or ()]


class _Node:
    def __init__(self, node_rank: int):
        self.node_rank = node_rank


def run_row(root: Path) -> dict[str, Any]:
    """One run as the runs page lists it, from its run.json and plan.json (1,000 runs: no profile is
    parsed, no plan built)."""
    from ..rundir.paths import read_json
    from ..rundir.record import RunRecord

    plan = read_json(root / "plan.json")
    record = RunRecord.from_json(read_json(root / "run.json"), run_id=str(plan["run_id"]),
                                 profile=str(plan.get("profile_name")), backend=str(plan.get("backend")))
    texts = [newest_text(p, TAIL_BYTES) for p in layout.metrics_files(root, _PlanFiles(plan))]
    newest = last_metrics(texts) or {}
    first = record.attempts[0] if record.attempts else None
    started = (first.started_at if first else None) or record.started_at or record.submitted_at
    ended = record.finished_at or record.stopped_at
    start = epoch(started)
    end = epoch(ended) if record.state.is_over else time.time()
    command = plan.get("command") or ()
    total = (plan.get("train") or {}).get("steps") if not command else None
    return {"run_id": record.run_id, "state": str(record.state), "profile": record.profile,
            "backend": record.backend, "nodes": record.num_nodes or plan.get("num_nodes"), "attempt": record.attempt,
            "started_at": started, "duration_s": round(end - start, 1) if start and end else None,
            "step": newest.get("step"), "total_steps": total if isinstance(total, int) else None,
            "loss": newest.get("loss"), "tokens_per_s": newest.get("tokens_per_s"),
            "exit_code": record.exit_code, "command": " ".join(command) if command else None}


def _scripts_dir(run: Any) -> Path:
    """A run's scripts folder (``run``: a Run handle or a RunDir)."""
    return (run.root if hasattr(run, "root") else run.path) / "scripts"


def run_page(run: Any, snapshot: dict[str, Any]) -> dict[str, Any]:
    """One run's page besides its charts: the snapshot, the plan in brief, the scripts' names."""
    plan = run.plan
    folder = _scripts_dir(run)
    scripts = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    return {"snapshot": snapshot, "scripts": scripts,
            "plan": {"run_id": plan.run_id, "profile": plan.profile_name, "backend": plan.backend,
                     "nodes": [{"node_rank": n.node_rank, "host": n.host, "address": n.address, "nproc": n.nproc}
                               for n in plan.nodes],
                     "num_nodes": plan.num_nodes, "nproc_per_node": plan.nproc_per_node,
                     "world_size": plan.world_size, "master": f"{plan.master_addr}:{plan.master_port}",
                     "run_dir_on_nodes": plan.run_dir, "command": list(plan.command) or list(plan.entry),
                     "train": dict(plan.train), "env": {k: str(v) for k, v in plan.env.items()},
                     "secrets": list(plan.secrets), "export": dict(plan.export or {})}}


def script_text(run: Any, name: str) -> Optional[str]:
    """A rendered script of the run by its name (None: no such script). Only names listed in the run's
    scripts folder are read, never a path."""
    folder = _scripts_dir(run)
    if not folder.is_dir() or name not in {p.name for p in folder.iterdir() if p.is_file()}:
        return None
    return (folder / name).read_text(encoding="utf-8", errors="replace")


def hosts_page(profile_name: str, runs_index: RunsIndex) -> dict[str, Any]:
    """A profile's hosts: active (node rank, the host a spare stands in for), spare, excluded (why,
    since when, by which run); the last doctor's (or preflight's) findings per host; each host's
    straggler count over the registry's runs."""
    from ..api.hosts import hosts
    from ..hostpool.findings import last_findings

    # The profile as its newest run kept it (it may live anywhere: a path given to launch), else by name.
    kept = next((runs_index.runs_dir / r["run_id"] / "profile.yaml" for r in runs_index.listing()
                 if r["profile"] == profile_name), None)
    found = [h.to_json() for h in hosts(str(kept) if kept is not None and kept.exists() else profile_name)]
    doctor = last_findings(profile_name)
    stragglers = straggler_counts(runs_index, profile_name)
    for host in found:
        host["doctor"] = doctor.get(host["host"])
        host["stragglers"] = stragglers.get(host["host"], 0)
    return {"profile": profile_name, "hosts": found}


def straggler_counts(index: RunsIndex, profile_name: str) -> dict[str, int]:
    """Per host, in how many of the profile's runs it held the straggler (its summary, else its newest row)."""
    counts: dict[str, int] = {}
    for row in index.listing():
        if row["profile"] != profile_name:
            continue
        host = _straggler_host(index.runs_dir / row["run_id"])
        if host:
            counts[host] = counts.get(host, 0) + 1
    return counts


def _straggler_host(root: Path) -> Optional[str]:
    for summary in [root / "summary.json", *sorted((root / layout.LIVE).glob("node*/summary.json"))]:
        try:
            data = json.loads(summary.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        straggler = data.get("straggler") if isinstance(data, dict) else None
        if isinstance(straggler, dict) and straggler.get("host"):
            return str(straggler["host"])
    return None
