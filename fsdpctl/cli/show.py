"""How plans and scripts are printed: a readable summary, or JSON (stdout is data)."""

from __future__ import annotations

import json
import shlex
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
        "# environment: " + " ".join([*(f"{k}={v}" for k, v in plan.env.items()),
                                      *(f"{name}=<secret>" for name in plan.secrets)]),
    ]
    for node in plan.nodes:
        on = f" on GPUs {','.join(map(str, node.gpus))}" if node.gpus else ""
        lines.append(f"# node {node.node_rank}: {node.host} ({node.address}), {node.nproc} process(es){on}")
    if plan.command:
        lines.append(f"# every rank runs: {shlex.join(plan.command)}  (in {plan.chdir} of the run directory)"
                     if not plan.chdir.startswith(("/", "~")) else
                     f"# every rank runs: {shlex.join(plan.command)}  (in {plan.chdir} on the nodes, nothing copied)")
    if plan.code is not None:
        from ..bundle import human_size

        largest = ", ".join(f"{name} ({human_size(size)})" for name, size in plan.code.largest)
        lines.append(f"# code: {plan.code.files} files, {human_size(plan.code.bytes)} from {plan.code.source} "
                     f"({'what git would commit' if plan.code.origin == 'git' else 'all but the ignored'}); "
                     f"largest: {largest or 'none'}")
        lines += [f"# code: not copied, a link out of the folder: {link}" for link in plan.code.skipped_links]
    if plan.environment is not None:
        env = plan.environment
        lines.append(f"# python environment: made on every node from {env.source} (uv; cached under {env.root}, "
                     f"keep {env.keep}); the ranks run {env.python}, made from {env.base_python}")
    if plan.requirements:
        lines.append("# required on every node: " + ", ".join(plan.requirements))
    lines += [f"# warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def print_warnings(warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        typer.secho(f"fsdpctl: warning: {warning}", err=True, fg="yellow")


def print_dry_run(plan: LaunchPlan, scripts: dict[str, str], as_json: bool, warnings: tuple[str, ...] = ()) -> None:
    """Print the plan and every rendered script to stdout (``warnings`` to stderr)."""
    print_warnings(warnings)
    if as_json:
        typer.echo(json.dumps({"plan": plan.to_json(), "scripts": scripts}, indent=2))
        return
    typer.echo(plan_summary(plan))
    for name, text in scripts.items():
        typer.echo(f"\n# ---- {name} ----")
        typer.echo(text, nl=False)
