"""doctor's measured checks, each a short run of its own through the launch path: the collective
smoke test (``--collectives``), the compute check (``--compute``: a matmul on every rank at once)
and the link check (``--links``: every pair of nodes, in rounds of disjoint pairs). What they find
about a host lands in that host's checks, so the table, ``--json`` and the verdict show it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from .events import Emitter
from .options import PathLike

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..hostcheck.checks import Check, DoctorReport
    from ..profiles.loader import LoadedProfile


@dataclass(frozen=True)
class MeasuredRun:
    """One measured check: the workload module that runs it, its arguments, and how it is read."""

    name: str
    module: str
    args: tuple[str, ...]
    read: Callable[[list[str]], Optional[dict[str, Any]]]
    env: Optional[dict[str, str]] = None
    one_rank_per_node: bool = False


def measured_run(name: str, device: str) -> MeasuredRun:
    """The run behind ``doctor --<name>`` on the profile's ``device``."""
    from ..hostcheck.collectives import COLLECTIVES_ENV, COLLECTIVES_MODULE, collectives_result
    from ..hostcheck.compute import COMPUTE_MODULE, compute_result
    from ..hostcheck.links import LINKS_MODULE, links_result

    if name == "collectives":
        return MeasuredRun(name, COLLECTIVES_MODULE, ("--device", device), collectives_result, dict(COLLECTIVES_ENV))
    if name == "compute":
        return MeasuredRun(name, COMPUTE_MODULE, ("--device", device), compute_result)
    # One rank per node: a pair's figure is then its nodes' link, not the ranks sharing it.
    return MeasuredRun(name, LINKS_MODULE, ("--device", device), links_result, one_rank_per_node=True)


def run_measured(loaded: LoadedProfile, backend: Backend, emit: Emitter, what: MeasuredRun,
                 runs_dir: Optional[PathLike] = None) -> dict[str, Any]:
    """Run one measured check as a run of its own; its figures (or why there are none)."""
    from ..bundle import Payload, node_payload
    from ..plan.types import Overrides
    from ..rundir.rundir import create_run
    from .prepare import build_plan

    overrides = Overrides(entry_module=what.module, entry_args=what.args, extra_env=what.env or {},
                          nproc_per_node=1 if what.one_rank_per_node else None)
    plan = build_plan(loaded, overrides, backend=backend.name,
                      runs_dir=Path(runs_dir) if runs_dir is not None else None)
    scripts = backend.scripts(plan)
    lines: list[str] = []
    emit.notice(f"doctor: {what.name} check as run {plan.run_id}")
    run = create_run(plan, loaded.profile, scripts, loaded.text)
    follower = backend.start(run, Payload(node_payload(scripts)), detached=False)
    outcome = follower.follow(lambda line: lines.append(line.text))
    found = what.read(lines)
    if outcome.exit_code or found is None:
        return {"run_id": plan.run_id, "error": f"the {what.name} check exited {outcome.exit_code}",
                "last_lines": lines[-15:]}
    return {"run_id": plan.run_id, **found}


def add_compute_checks(report: DoctorReport, result: dict[str, Any]) -> None:
    """The compute verdict on each host: slow GPUs and slow nodes fail where they are."""
    from ..hostcheck.checks import Check
    from ..hostcheck.compute import judge_compute

    verdict = judge_compute(result)
    result["verdict"] = verdict.text
    slow = {rank for rank, *_ in verdict.slow_ranks}
    by_host: dict[str, list[dict[str, Any]]] = {}
    for rank in result.get("ranks") or []:
        by_host.setdefault(str(rank.get("host")), []).append(rank)
    median = verdict.median_tflops or 0.0
    for host, ranks in by_host.items():
        mine = [r for r in ranks if r["rank"] in slow]
        figures = ", ".join(f"{_flops(float(r['tflops']))}" for r in ranks)
        if mine:
            named = ", ".join(f"local rank {r.get('local_rank')} at {float(r['tflops']) / median:.2f}x" for r in mine)
            check = Check("compute", "fail", f"{named} the median ({figures}; median {_flops(median)})",
                          "a throttled or faulty GPU, or another process on this node: look at its doctor "
                          "--health findings and its load")
        else:
            check = Check("compute", "pass", f"{figures} (median {_flops(median)})")
        _attach(report, host, ranks[0].get("node"), check)


def add_link_checks(report: DoctorReport, result: dict[str, Any]) -> None:
    """The link verdict on each host: a node named as the slow link fails; a slow pair that no named
    node explains warns on both of its ends (the named node's partners are not held to it)."""
    from ..hostcheck.checks import Check
    from ..hostcheck.links import judge_links

    verdict = judge_links(result)
    result["verdict"] = verdict.text
    nodes = {int(n["node"]): n for n in result.get("nodes") or []}
    named = dict(verdict.slow_nodes)
    for index, node in nodes.items():
        pairs = [p for p in verdict.slow_pairs if index in p[:2] and not set(p[:2]) & set(named)]
        figures = sorted(float(p["gbps"]) for p in result.get("pairs") or [] if index in (p["a"], p["b"]))
        shown = f"{figures[0]:.3g}-{figures[-1]:.3g} GB/s" if figures else "no pair"
        if index in named:
            check = Check("links", "fail", f"the slow link: {named[index]} ({shown})",
                          "check this node's network card, cable and switch port, and its interface's "
                          "settings (MTU, speed: ethtool); ask the network administrator")
        elif pairs:
            others = ", ".join(nodes[b if a == index else a]["host"] for a, b, *_ in pairs)
            check = Check("links", "warn", f"slow to {others} ({shown})",
                          "one pair alone is slow: check the path between these two nodes")
        else:
            check = Check("links", "pass", shown)
        _attach(report, str(node.get("host")), node.get("node_rank"), check)


def _attach(report: DoctorReport, host: str, node_rank: Any, check: Check) -> None:
    """Onto the host's report (by name, else by node rank); a host doctor did not list: the cluster's."""
    target = next((h for h in report.hosts if h.host == host), None)
    if target is None and isinstance(node_rank, int):
        target = next((h for h in report.hosts if h.node_rank == node_rank), None)
    if target is not None:
        target.checks.append(check)
    else:
        from dataclasses import replace

        report.cluster.append(replace(check, detail=f"{host}: {check.detail}"))


def _flops(tflops: float) -> str:
    return f"{tflops:.0f} TFLOP/s" if tflops >= 1 else f"{tflops * 1000:.1f} GFLOP/s"
