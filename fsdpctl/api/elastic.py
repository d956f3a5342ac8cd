"""An elastic run on another number of nodes: how the bundled workload keeps its global batch there
(more accumulation, or a larger per-rank batch where ``estimate`` finds it fits), said before the
attempt starts; and the record of the change."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..hostpool.choice import reasons
from ..live import layout
from ..metrics.rows import read_event_rows
from ..node.events import BATCH_SPLIT
from ..rundir.status import Resize
from ..workload.elastic import BatchSplitError, describe_split, split_global_batch

if TYPE_CHECKING:
    from ..hostpool.choice import HostChoice
    from ..rundir.rundir import RunDir
    from .events import Emitter

ESTIMATE_TRIES = 2
"""Larger per-rank batches traced before the attempt starts (each trace takes seconds to a minute)."""


@dataclass(frozen=True)
class BatchPlan:
    """How the bundled workload trains its global batch on the next attempt's nodes."""

    text: Optional[str]
    """``global batch 24 kept: batch 8 x accumulation 3 per rank`` (None: not known here)."""
    limit: Optional[int] = None
    """A per-rank batch larger than the one given that ``estimate`` found to fit (None: keep it)."""
    refused: Optional[str] = None
    """Why the global batch cannot be kept on that many nodes (the attempt must not start)."""


def global_batch(run: RunDir) -> Optional[tuple[int, int]]:
    """(the run's global batch, its per-rank batch as given) from the newest batch split the bundled
    workload's rank 0 wrote (its ``BATCH_SPLIT`` row, at the start of every attempt of an elastic run,
    in the run's metrics copies); None before it wrote one."""
    plan = run.plan
    splits = read_event_rows(layout.node_files(run.root, plan, layout.METRICS), BATCH_SPLIT)
    if not splits:
        return None
    total, full = splits[-1].get("global_batch"), splits[-1].get("full")
    if not isinstance(total, int) or not isinstance(full, int) or total < 1 or full < 1:
        return None
    if plan.train.get("batch_size"):
        return total, int(plan.train["batch_size"])
    accum = int(plan.train.get("grad_accum") or 1)  # the batch as given: the global batch over the full world
    return (total, total // (full * accum)) if total % (full * accum) == 0 else None


def batch_on(run: RunDir, nodes: int, emit: Emitter) -> BatchPlan:
    """The bundled workload's split of its global batch on ``nodes`` nodes (the same ranks per
    node): a larger per-rank batch when ``grow_batch`` is on, the GPUs' memory is known and a trace
    says it fits; else the batch as given, with more accumulation."""
    plan = run.plan
    if plan.command or plan.elastic is None:
        return BatchPlan(None)
    known = global_batch(run)
    if known is None:
        return BatchPlan(None)
    total, batch = known
    world = _world(run, nodes)
    if world is None:  # ranks per node counted on the nodes: each rank splits it
        if total % nodes:
            return BatchPlan(None, refused=f"the global batch of {total} sequences does not split evenly over "
                                           f"{nodes} nodes")
        return BatchPlan(f"global batch {total} kept ({total // nodes} sequences per node)")
    try:
        split = split_global_batch(total, world, batch)
    except BatchSplitError as error:
        return BatchPlan(None, refused=str(error))
    limit = _larger_batch(run, nodes, total // world, batch, emit) if split[1] > 1 else None
    if limit:
        split = split_global_batch(total, world, limit)
    return BatchPlan(f"global batch {total} kept: {describe_split(*split)}", limit)


def _world(run: RunDir, nodes: int) -> Optional[int]:
    nproc = run.plan.nproc_per_node
    return nodes * int(nproc) if str(nproc).isdigit() else None


def _larger_batch(run: RunDir, nodes: int, share: int, batch: int, emit: Emitter) -> Optional[int]:
    """The largest per-rank batch above ``batch`` (a divisor of ``share``) that ``estimate`` finds
    fits the GPUs on ``nodes`` nodes; None: none does, or nothing is known to hold it to."""
    elastic, profile = run.plan.elastic, run.profile
    if elastic is None or not elastic.grow_batch or profile.gpu_memory is None or profile.device == "cpu":
        return None
    from ..profiles.loader import LoadedProfile
    from .estimate import estimate

    loaded = LoadedProfile(profile, run.paths.root / "profile.yaml", "")
    candidates = sorted((d for d in range(batch + 1, share + 1) if share % d == 0), reverse=True)
    for size in candidates[:ESTIMATE_TRIES]:
        try:
            found = estimate(loaded, nodes=nodes, batch_size=size, choices=False, train=run.plan.train,
                             timeout=300.0)
        except Exception as exc:  # noqa: BLE001 - no estimate: keep the batch as given (it ran before)
            emit.notice(f"elastic: could not estimate batch {size} on {nodes} nodes ({exc}); keeping batch {batch}",
                        "warning")
            return None
        if found.fits:
            return size
    return None


@dataclass(frozen=True)
class NodeChange:
    """The next attempt of an elastic run on another number of nodes: its record, and its batch."""

    record: Resize
    batch: BatchPlan

    @property
    def refused(self) -> Optional[str]:
        return self.batch.refused


def change_of(run: RunDir, choice: HostChoice, excluded: Mapping[str, str], emit: Emitter,
              back: str = "passed its checks again") -> NodeChange:
    """The change from the run's last attempt to ``choice``: fewer nodes (the hosts gone out, with
    why), or more (the hosts back, ``back`` saying how)."""
    nodes, before = len(choice.hosts), run.plan.num_nodes
    previous = [n.host for n in run.record.nodes]
    if nodes > before:
        hosts, why = tuple(h for h in choice.hosts if h not in previous), back
    else:
        hosts = tuple(h for h in previous if h not in choice.hosts) or choice.missing
        why = reasons(hosts, excluded)
    batch = batch_on(run, nodes, emit)
    return NodeChange(Resize(nodes=nodes, before=before, full=choice.full, hosts=hosts, why=why, batch=batch.text),
                      batch)
