"""The elastic policy, the one place that decides for an elastic run (pure): its part of the plan
(``ElasticPlan``), may an attempt go on without a host, how many nodes the next attempt has and how
often the count changed, and when a run short of nodes grows back.

Who acts on these decisions: a failed attempt's restart (``api.restarting``), the next attempt's plan
(``api.attempts``), the watch that grows a run back at a checkpoint (``api.growing``) and Slurm's
steps (``backends.slurm.plan``). What the plan and every rank are told of it: ``plan.elastic``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class ElasticPlan:
    """An elastic run's part of the plan (``LaunchPlan.elastic``; None: the run is not elastic)."""

    min_nodes: int
    """The fewest nodes an attempt may run on."""
    full_nodes: int
    """The run's full size: the nodes its first attempt was placed on, or would have been."""
    changes: int = 0
    """How often the run's node count changed before this attempt (``FSDPCTL_ELASTIC_ATTEMPT``)."""
    recheck: bool = False
    """At each checkpoint of a short attempt, re-check the excluded hosts (``elastic.recheck``)."""
    grow_batch: bool = True
    """On fewer nodes, the bundled workload may take a larger per-rank batch that fits (``elastic.grow_batch``)."""

    def goes_on_with(self, nodes: int) -> bool:
        """May an attempt run on ``nodes`` nodes."""
        return nodes >= self.min_nodes

    def is_short(self, nodes: int) -> bool:
        """Is an attempt on ``nodes`` nodes short of the run's full size."""
        return nodes < self.full_nodes


def elastic_from_json(data: Optional[dict[str, Any]]) -> Optional[ElasticPlan]:
    """A plan.json's ``elastic`` back (``{}``, as fsdpctl 0.2 wrote it, and None: not elastic)."""
    return ElasticPlan(**data) if data else None


def min_nodes_in(elastic: Optional[ElasticPlan]) -> int:
    """The fewest nodes the run may go on with (0: not elastic; every node it was given)."""
    return elastic.min_nodes if elastic is not None else 0


def goes_without(elastic: Optional[ElasticPlan], *, lost: bool, hosts_left: int) -> bool:
    """May the next attempt go on without a blamed host that no spare replaces, rather than re-check
    it and run on it again: only a lost host (silent for the node timeout: its re-check would wait
    for SSH's own timeout) of an elastic run that ``hosts_left`` keep at ``min_nodes`` or more."""
    return lost and elastic is not None and elastic.goes_on_with(hosts_left)


def goes_on_short(elastic: Optional[ElasticPlan], hosts: int) -> bool:
    """May an attempt start on ``hosts`` hosts when the profile cannot give it every node."""
    return elastic is not None and elastic.goes_on_with(hosts)


def next_size(elastic: Optional[ElasticPlan], *, nodes_before: int, nodes: int,
              full_nodes: Optional[int]) -> dict[str, Any]:
    """The next attempt's elastic overrides (``Overrides.full_nodes``, ``elastic_changes``) when it
    runs on ``nodes`` nodes after an attempt on ``nodes_before``: its full size (``full_nodes`` when
    placing found it, else the run's), kept only while it is short of it; a change of count counted.
    Empty for a run that is not elastic."""
    if elastic is None:
        return {}
    full = full_nodes or elastic.full_nodes
    return {"full_nodes": full if nodes < full else None,
            "elastic_changes": elastic.changes + (nodes != nodes_before)}


def grows_back(elastic: Optional[ElasticPlan], *, nodes: int, placeable: int) -> bool:
    """Does a run whose attempt has ``nodes`` nodes grow back, now that ``placeable`` of its hosts
    can be placed: it is short of its full size and more of its hosts are back."""
    return elastic is not None and elastic.is_short(nodes) and placeable > nodes
