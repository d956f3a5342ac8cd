"""``fsdpctl launch``: run the bundled workload on every node of a profile."""

from __future__ import annotations

from typing import Optional

from ..errors import UsageError
from ..plan import Overrides
from ..render import render_all
from . import common
from .show import print_dry_run


def launch(
    profile: str = common.ProfileOpt,
    fsdp: Optional[int] = common.FsdpOpt,
    preset: Optional[str] = common.PresetOpt,
    steps: Optional[int] = common.StepsOpt,
    epochs: Optional[int] = common.EpochsOpt,
    batch_size: Optional[int] = common.BatchOpt,
    sharding: Optional[str] = common.ShardingOpt,
    mixed_precision: Optional[str] = common.PrecisionOpt,
    settings: Optional[list[str]] = common.SetOpt,
    nproc_per_node: Optional[int] = common.NprocOpt,
    master_port: Optional[int] = common.PortOpt,
    debug: bool = common.DebugOpt,
    dry_run: bool = common.DryRunOpt,
    as_json: bool = common.JsonOpt,
) -> None:
    """Start the bundled FSDP/FSDP2 GPT training on every node of PROFILE."""
    train = common.train_overrides(fsdp=fsdp, preset=preset, steps=steps, epochs=epochs,
                                   batch_size=batch_size, sharding=sharding,
                                   mixed_precision=mixed_precision, settings=settings)
    overrides = Overrides(train=train, nproc_per_node=nproc_per_node, master_port=master_port, debug=debug)
    _, plan = common.build_plan(profile, overrides, for_slurm=False)
    scripts = render_all(plan)
    if dry_run:
        print_dry_run(plan, scripts, as_json)
        return
    if as_json:
        raise UsageError("--json goes with --dry-run", "add --dry-run, or drop --json")
    raise UsageError(f"launching a {plan.backend} profile is not available in this version",
                     "use --dry-run and run each printed node script on its node")
