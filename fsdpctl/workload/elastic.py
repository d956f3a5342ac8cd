"""An elastic run's global batch on another number of ranks (standard library only: fsdpctl's
launcher says the split before an attempt starts, the trainer applies it on every rank).

The run's global batch is ``original world x batch x grad_accum`` (the settings as given, for the
full-size run). On ``world`` ranks each rank trains ``global / world`` sequences a step: in
micro-batches of the largest size that divides that share and stays within ``limit`` (the batch
as given, or a larger one ``estimate`` found to fit), the rest by accumulation.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Optional

ORIGINAL_WORLD = "FSDPCTL_ORIGINAL_WORLD_SIZE"
"""The run's world size at its full size: every rank of an elastic run has it."""
ORIGINAL_NODES = "FSDPCTL_ORIGINAL_NODES"
"""The run's node count at its full size."""
ELASTIC_ATTEMPT = "FSDPCTL_ELASTIC_ATTEMPT"
"""How often the run's node count changed before this attempt (0: never)."""
BATCH_LIMIT = "FSDPCTL_ELASTIC_BATCH_LIMIT"
"""The largest per-rank batch the bundled workload may take on fewer ranks (unset: the one given)."""


class BatchSplitError(ValueError):
    """The global batch does not split evenly over the ranks there are."""


def split_global_batch(global_batch: int, world: int, limit: int) -> tuple[int, int]:
    """(per-rank batch, accumulation steps) that train ``global_batch`` sequences a step on ``world``
    ranks, with the largest per-rank batch that divides the share and is at most ``limit``."""
    if global_batch % world:
        raise BatchSplitError(f"the global batch of {global_batch} sequences does not split evenly over "
                              f"{world} ranks")
    share = global_batch // world
    batch = max(d for d in range(1, min(share, max(limit, 1)) + 1) if share % d == 0)
    return batch, share // batch


def original_world(env: Mapping[str, str], local_world: Optional[int] = None) -> Optional[int]:
    """The run's full-size world, from its environment (the node count times this node's ranks when
    the launcher could not count them itself); None: not an elastic run."""
    if env.get(ORIGINAL_WORLD, "").isdigit():
        return int(env[ORIGINAL_WORLD])
    if env.get(ORIGINAL_NODES, "").isdigit() and local_world:
        return int(env[ORIGINAL_NODES]) * local_world
    return None


def batch_limit(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The per-rank batch limit the launcher chose (None: the batch given is the limit)."""
    value = env.get(BATCH_LIMIT, "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def describe_split(batch: int, accum: int) -> str:
    """``batch 8 x accumulation 3 per rank`` (``batch 24 per rank`` without accumulation)."""
    return f"batch {batch} x accumulation {accum} per rank" if accum > 1 else f"batch {batch} per rank"


def split_fields(world: int, full: int, global_batch: int, batch: int, accum: int) -> dict[str, Any]:
    """What a ``BATCH_SPLIT`` row says (``fsdpctl.node.events``): the ranks now and at full size, the
    global batch, the per-rank batch and accumulation, and the split in words."""
    return {"world": world, "full": full, "global_batch": global_batch, "batch": batch, "accumulation": accum,
            "text": f"global batch {global_batch} kept: {describe_split(batch, accum)}"}


def split_line(split: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The trainer's line for people on fewer ranks than the run's full size (None: at its full size,
    or not an elastic run). The launcher reads the row, never this line."""
    if split is None or split["world"] == split["full"]:
        return None
    return f"elastic: {split['world']} of the run's {split['full']} ranks; {split['text']}"


def on_this_world(cfg, world: int, local_world: int, env: Mapping[str, str] = os.environ):
    """The trainer's settings (a ``TrainConfig``) for this attempt's ``world``: on fewer ranks than
    the run's full size, the batch and accumulation that keep its global batch, and as many
    validation batches as keep the windows it validates on; and how the global batch is split
    (``split_fields``, at the full size too; None: not an elastic run). BatchSplitError when the
    global batch cannot be kept."""
    full = original_world(env, local_world)
    if full is None:
        return cfg, None
    global_batch = full * cfg.batch_size * cfg.grad_accum
    if full == world:
        return cfg, split_fields(world, full, global_batch, cfg.batch_size, cfg.grad_accum)
    batch, accum = split_global_batch(global_batch, world, batch_limit(env) or cfg.batch_size)
    validated = full * cfg.batch_size * cfg.eval_steps  # windows of one evaluation at full size
    eval_steps = validated // (world * batch) if validated % (world * batch) == 0 else cfg.eval_steps
    return (dataclasses.replace(cfg, batch_size=batch, grad_accum=accum, eval_steps=eval_steps),
            split_fields(world, full, global_batch, batch, accum))
