"""A profile's ``elastic`` section: runs that go on with fewer nodes and grow back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ElasticSpec:
    """Runs that go on with fewer nodes when a node is to blame and no spare is left, and grow back
    when its host returns. The bundled workload keeps its global batch (more accumulation, or a larger
    per-rank batch where ``estimate`` says it fits), its data order, learning rate and step count; your
    own program gets ``FSDPCTL_ORIGINAL_WORLD_SIZE`` and ``FSDPCTL_ELASTIC_ATTEMPT``
    (docs/guides/restarts-and-spares.md, "For elastic runs")."""

    min_nodes: int
    """The fewest nodes a run goes on with. Below it, the run ends as without ``elastic``."""
    recheck: bool = False
    """While a run is short of nodes, re-check its excluded hosts at each checkpoint: one that passes
    is put back (as ``hosts --restore``) and the run grows back at that checkpoint (ssh)."""
    grow_batch: bool = True
    """The bundled workload on fewer nodes: take a larger per-rank batch (fewer accumulation steps)
    where the profile's ``gpu_memory`` is known and ``estimate`` says it fits; false, or on CPUs: keep
    the per-rank batch and accumulate more."""
