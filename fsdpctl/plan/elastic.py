"""An elastic run's part of the plan, made from the profile and the command line, and what every rank
is told of it (pure). What it decides is ``elastic_policy``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ..errors import UsageError
from ..workload.elastic import BATCH_LIMIT, ELASTIC_ATTEMPT, ORIGINAL_NODES, ORIGINAL_WORLD
from .elastic_policy import ElasticPlan

if TYPE_CHECKING:
    from ..profiles.schema import ClusterProfile
    from .types import Overrides


def min_nodes_of(profile: ClusterProfile, overrides: Optional[Overrides] = None) -> int:
    """The fewest nodes a run may go on with: ``--min-nodes`` over the profile's ``elastic.min_nodes``
    (0: the run is not elastic)."""
    if overrides is not None and overrides.min_nodes is not None:
        return overrides.min_nodes
    return profile.elastic.min_nodes if profile.elastic else 0


def elastic_settings(profile: ClusterProfile, overrides: Overrides, num_nodes: int) -> Optional[ElasticPlan]:
    """The plan's ``elastic`` (None: the run is not elastic): its ``min_nodes`` (``min_nodes_of``);
    the full size is the one an earlier attempt had, else this one's."""
    spec = profile.elastic
    min_nodes = min_nodes_of(profile, overrides)
    if not min_nodes:
        return None
    full = overrides.full_nodes or num_nodes
    if min_nodes > full:
        raise UsageError(f"--min-nodes {min_nodes}: more than the run's {full} nodes",
                         f"give {full} or fewer (the fewest nodes the run may go on with)")
    return ElasticPlan(min_nodes=min_nodes, full_nodes=full, changes=overrides.elastic_changes,
                       recheck=bool(spec.recheck) if spec else False,
                       grow_batch=spec.grow_batch if spec else True)


SAY_SAVES = "FSDPCTL_SAY_SAVES"
"""Set for a program of yours in an elastic run: rank 0's start-up hook says each DCP save (the bundled
workload says its own checkpoints)."""


def elastic_env(elastic: Optional[ElasticPlan], nproc: str, batch_limit: Optional[int], program: bool = False
                ) -> dict[str, str]:
    """What every rank of an elastic run is told: its full size (nodes, and ranks when every node's
    count is known here), how often its node count changed, the bundled workload's batch limit; a
    ``program`` of yours, to have its DCP saves said."""
    if elastic is None:
        return {}
    env = {ORIGINAL_NODES: str(elastic.full_nodes), ELASTIC_ATTEMPT: str(elastic.changes)}
    if program:
        env[SAY_SAVES] = "1"
    if nproc.isdigit():  # else each rank works it out from its node's count (``workload.elastic``)
        env[ORIGINAL_WORLD] = str(elastic.full_nodes * int(nproc))
    if batch_limit:
        env[BATCH_LIMIT] = str(batch_limit)
    return env
