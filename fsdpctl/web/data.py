"""What the dashboard's pages show, as JSON-ready data, made from what ``fsdpctl.live`` and the API read
here (run directories, the registry, the profile's hosts): nothing in this module asks a node.

``RunsIndex`` keeps the registry's rows, re-reading a run only when its record or metrics changed
(1,000 runs: a few thousand stat calls per look), seeded from the registry index ``fsdpctl runs``
reads. ``run_page`` is one run: its snapshot, plan and scripts; its charts come from
``fsdpctl.live.charts`` (``hub``). ``hosts_page`` is a profile's hosts with the last doctor's
findings and each host's straggler count across runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from ..live import layout
from ..rundir.index import RegistryIndex, make_row
from ..rundir.record import epoch
from ..rundir.state import RunState


class RunsIndex:
    """The registry as the runs page shows it: the registry index's rows (``fsdpctl.rundir.index``, the
    file ``fsdpctl runs`` reads too), kept in memory and re-read for a run only when its files changed."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = runs_dir
        self.registry = RegistryIndex(runs_dir)

    def listing(self) -> list[dict[str, Any]]:
        """Every run, newest first."""
        now = time.time()
        return [page_row(item.row, now) for item in reversed(self.registry.runs())]


def page_row(row: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A registry index row as the runs page lists it (a live run's duration: to ``now``)."""
    start = epoch(row["first_started_at"])
    end = epoch(row["ended_at"]) if RunState.parse(row["state"]).is_over else now
    return {"run_id": row["run_id"], "state": row["state"], "profile": row["profile"], "backend": row["backend"],
            "nodes": row["num_nodes"] or row["plan_nodes"], "attempt": row["attempt"],
            "started_at": row["first_started_at"], "duration_s": round(end - start, 1) if start and end else None,
            "step": row["step"], "total_steps": row["total_steps"], "loss": row["loss"],
            "tokens_per_s": row["tokens_per_s"], "exit_code": row["exit_code"], "command": row["command"]}


def run_row(root: Path) -> dict[str, Any]:
    """One run as the runs page lists it, from its run.json, plan.json and the end of its metrics
    (no profile is parsed, no plan built)."""
    return page_row(make_row(root)[0], time.time())


def _scripts_dir(run: Any) -> Path:
    """A run's scripts folder (``run``: a Run handle or a RunDir)."""
    return (run.root if hasattr(run, "root") else run.path) / "scripts"


def run_page(run: Any, snapshot: dict[str, Any], goodput: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One run's page besides its charts: the snapshot, the plan in brief, the scripts' names, where
    its time went (``goodput``: ``fsdpctl.accounting.cache.counted_json``), its profiles' summaries."""
    plan = run.plan
    folder = _scripts_dir(run)
    scripts = sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    from ..diagnose.trace_summary import kept_profiles

    root = run.root if hasattr(run, "root") else run.path
    return {"snapshot": snapshot, "scripts": scripts, "goodput": goodput, "profiles": kept_profiles(root),
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
