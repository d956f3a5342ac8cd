"""What ``doctor`` says of a profile's environment: whether each node already holds it (its name links to
a whole environment there), and so which Python the probe judges on each node: the environment's where
it is made, the profile's own where launch will make it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from ..errors import HostError
from ..plan.environment import EnvPlan
from ..shell import after_mark
from .nodes import answer_in, helper_command

HELD_TIMEOUT = 60.0


def node_facts(plan: EnvPlan, transport: Any, mode: str = "facts") -> Optional[dict[str, Any]]:
    """A node's environment facts (``mode: list`` adds each environment's size); None where its Python
    cannot run the helper (the probe says why)."""
    args = {"root": plan.root, "name": plan.name, "base": plan.base_python, "mode": mode}
    try:
        status, out, _ = transport.run(helper_command(plan, args), HELD_TIMEOUT)
    except HostError:
        return None
    said = answer_in(after_mark(out))
    return said[1] if status == 0 and said is not None and said[0] == "facts" else None


def held_key(plan: EnvPlan, facts: Optional[dict[str, Any]]) -> Optional[str]:
    """The key the environment's name points at on the node, when that environment is whole there."""
    if not facts:
        return None
    key = facts.get("names", {}).get(plan.name)
    return key if key in facts.get("ready", {}) else None


def held_on(plan: EnvPlan, transports: Sequence[tuple[int, Any]]) -> dict[int, Optional[dict[str, Any]]]:
    """Each node's facts by rank, all asked at once."""
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(transports)))) as pool:
        found = list(pool.map(lambda item: node_facts(plan, item[1]), transports))
    return {rank: facts for (rank, _), facts in zip(transports, found, strict=True)}


def environment_check(plan: EnvPlan, facts: Optional[dict[str, Any]]):
    """The node's ``environment`` row: made (with what), or launch will make it."""
    from ..hostcheck.checks import Check

    key = held_key(plan, facts)
    if key is None:
        return Check("environment", "warn", f"{plan.name} (from {plan.source}) is not made here yet: launch will make "
                                            f"it; versions below are {plan.base_python}'s own",
                     "nothing to do: `fsdpctl launch` makes it (or see `fsdpctl env -p PROFILE`)")
    record = facts["ready"][key] if facts else {}
    return Check("environment", "pass", f"{plan.name} made ({key}, {len(record.get('packages', {}))} packages, "
                                        f"from {record.get('source') or plan.source}): the ranks run in it")


# Facts an environment does not change: its Python is the node's own, and the rest is the machine's.
_NOT_THE_ENVIRONMENTS = ("python", "image", "driver_major", "ib_rate", "mtu")
LAUNCH_FIXES = "launch will make the environment there; the ranks then run its versions"


def soften_parity(parity: list[Any], lacking: Sequence[str]) -> list[Any]:
    """Version rows that differ because some nodes do not hold the environment yet: launch makes it
    there, so the row warns and says so instead of failing with an install line."""
    if not lacking:
        return parity
    softened = []
    for entry in parity:
        if entry.status == "fail" and entry.fact not in _NOT_THE_ENVIRONMENTS:
            entry = dataclasses.replace(entry, status="warn",
                                        hint=f"{LAUNCH_FIXES} (not made yet on {', '.join(lacking)})")
        softened.append(entry)
    return softened


class EnvironmentJudge:
    """doctor's part for a profile with an environment: which Python each node's probe runs (the
    environment's where it is made), a row per node saying so, and version rows softened where launch
    will make it."""

    def __init__(self, plan: EnvPlan, workdir: str, base_python: str, nodes: Sequence[Any]):
        self.plan = plan.placed(workdir, base_python)
        self.held = held_on(self.plan, [(n.node_rank, n.transport) for n in nodes])

    def jobs(self, jobs: Sequence[Any]) -> list[Any]:
        return [dataclasses.replace(job, python=self.plan.python) if held_key(self.plan, self.held.get(job.node_rank))
                else job for job in jobs]

    def told(self, on_host: Optional[Callable[[Any], None]]) -> Callable[[Any], None]:
        def told(host: Any) -> None:  # each host's line says whether it holds the environment
            if not any(check.name == "environment" for check in host.checks):
                made = held_key(self.plan, self.held.get(host.node_rank)) is not None
                host.checks = [self._in_it(check) if made else _until_made(check) for check in host.checks]
                host.checks.append(environment_check(self.plan, self.held.get(host.node_rank)))
            if on_host is not None:
                on_host(host)
        return told

    def _in_it(self, check: Any) -> Any:
        """A missing package in the environment is added to what it is made from, not pip-installed."""
        if check.name == "packages" and check.status == "fail":
            return dataclasses.replace(check, hint=f"add them to {self.plan.source} (the environment is made from "
                                                   f"it) and launch again")
        return check

    def finish(self, report: Any) -> Any:
        report.parity = soften_parity(report.parity, [h.host for h in report.hosts
                                                      if not held_key(self.plan, self.held.get(h.node_rank))])
        return report


# What the node's own Python lacks that the environment brings: launch makes it before the ranks start.
_THE_ENVIRONMENTS = ("torch", "fsdp2", "packages")


def _until_made(check: Any) -> Any:
    if check.name in _THE_ENVIRONMENTS and check.status == "fail":
        return dataclasses.replace(check, status="warn", hint=LAUNCH_FIXES)
    return check


def node_listing(plan: EnvPlan, workdir: str, base_python: str, nodes: Sequence[tuple[int, str, Any]],
                 prune: bool, keep: int) -> list[dict[str, Any]]:
    """Each node's environments with their sizes (``fsdpctl env``), after a prune with ``prune``: a dict
    per node with ``host``, ``node_rank``, ``facts`` (None: unreachable, with ``error``), ``current``
    (the key the profile's environment points at there) and ``removed``."""
    placed = plan.placed(workdir, base_python)

    def one(node: tuple[int, str, Any]) -> dict[str, Any]:
        rank, host, transport = node
        answer: dict[str, Any] = {"host": host, "node_rank": rank, "root": placed.root, "removed": []}
        try:
            if prune:
                answer["removed"] = _pruned(placed, transport, keep)
            facts = node_facts(placed, transport, mode="list")
        except HostError as exc:
            return {**answer, "facts": None, "error": exc.detail}
        answer["facts"] = facts
        answer["current"] = held_key(placed, facts)
        if facts is None:
            answer["error"] = f"{base_python} could not run fsdpctl's helper there"
        return answer

    with ThreadPoolExecutor(max_workers=max(1, min(64, len(nodes)))) as pool:
        return list(pool.map(one, nodes))


def _pruned(plan: EnvPlan, transport: Any, keep: int) -> list[str]:
    current = held_key(plan, node_facts(plan, transport))
    args = {"root": plan.root, "mode": "prune", "keep": keep, "protect": [current] if current else []}
    status, out, err = transport.run(helper_command(plan, args), HELD_TIMEOUT)
    said = answer_in(after_mark(out))
    if said is None:
        raise HostError(transport.host, "environment", (err.strip() or f"exit {status}").splitlines()[-1],
                        "run the profile's python by hand there")
    word, answer = said
    if word == "error":
        raise HostError(transport.host, "environment", answer["message"], "look at the environment root there")
    return list(answer.get("removed", []))
