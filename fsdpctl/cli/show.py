"""How plans and scripts are printed: a readable summary, or JSON (stdout is data)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from ..plan.types import LaunchPlan


def plan_summary(plan: LaunchPlan) -> str:
    """A few lines saying what the run will do, for humans."""
    world = plan.world_size if plan.world_size is not None else "set by GPU count at start"
    lines = [
        f"# run {plan.run_id}  profile {plan.profile_name} ({plan.profile_source})",
        f"# backend {plan.backend}, {plan.num_nodes} node(s) x {plan.nproc_per_node} process(es), world size {world}",
        f"# rendezvous {plan.rdzv_backend} on {plan.master_addr}:{plan.master_port}"
        if plan.rdzv_backend != "standalone" else "# rendezvous: standalone (one node, free port)",
        f"# run directory on the nodes: {plan.run_dir}; here: {plan.local_run_dir}",
        "# environment: " + " ".join(f"{k}={v}" for k, v in plan.env.items()),
    ]
    for node in plan.nodes:
        lines.append(f"# node {node.node_rank}: {node.host} ({node.address}), {node.nproc} process(es)")
    lines += [f"# warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def print_dry_run(plan: LaunchPlan, scripts: dict[str, str], as_json: bool) -> None:
    """Print the plan and every rendered script to stdout."""
    if as_json:
        typer.echo(json.dumps({"plan": plan.to_json(), "scripts": scripts}, indent=2))
        return
    typer.echo(plan_summary(plan))
    for name, text in scripts.items():
        typer.echo(f"\n# ---- {name} ----")
        typer.echo(text, nl=False)
