"""Options and steps shared by commands that build a plan (launch, submit, render)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from ..errors import UsageError

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..plan.types import LaunchPlan, Overrides
    from ..profiles.loader import LoadedProfile
    from ..runs.record import Run

PROFILE_HELP = "Profile name (./cluster_profiles, ~/.config/fsdpctl/profiles, shipped) or a .yaml path."

# The workload flags worth a flag of their own; every other setting goes through --set or the profile.
ProfileOpt = typer.Option(..., "--profile", "-p", help=PROFILE_HELP)
JobProfileOpt = typer.Option(None, "--profile", "-p", help=PROFILE_HELP + " May come from --job.")
FsdpOpt = typer.Option(None, "--fsdp", help="FSDP version: 1 or 2.")
PresetOpt = typer.Option(None, "--preset", help="Model preset: tiny, small, gpt2-124m.")
StepsOpt = typer.Option(None, "--steps", help="Optimizer steps to train.")
EpochsOpt = typer.Option(None, "--epochs", help="Epochs to train (instead of --steps).")
BatchOpt = typer.Option(None, "--batch-size", help="Sequences per rank per micro-step.")
ShardingOpt = typer.Option(None, "--sharding", help="full, grad-op, no-shard or hybrid.")
PrecisionOpt = typer.Option(None, "--mixed-precision", help="auto, bf16, fp16 or fp32.")
SetOpt = typer.Option(None, "--set", help="Any workload setting as NAME=VALUE (repeatable), e.g. --set lr=1e-3.")
NprocOpt = typer.Option(None, "--nproc-per-node", help="Processes per node (overrides the profile).")
PortOpt = typer.Option(None, "--master-port", help="Rendezvous port on the master (overrides the profile).")
DebugOpt = typer.Option(
    False, "--debug", help="Add NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=ALL, TORCH_DISTRIBUTED_DEBUG=DETAIL."
)
DryRunOpt = typer.Option(False, "--dry-run", help="Print the plan and every rendered script; touch nothing.")
JsonOpt = typer.Option(False, "--json", help="With --dry-run: print the plan and scripts as JSON.")
HangTimeoutOpt = typer.Option(
    None, "--hang-timeout", min=0, metavar="SECONDS",
    help="Hang watchdog: after this long without progress (no new line from any rank; for the bundled workload, "
         "no new step) every rank's stack and the flight-recorder dumps go to runs/<id>/hang/, the odd rank is "
         "named, and the run ends with exit 124 (see --on-hang). 0: off. Default: the profile's hang_timeout.")
OnHangOpt = typer.Option(None, "--on-hang", metavar="stop|keep",
                         help="What a hang does: stop (end the run, exit 124) or keep (report and let it run). "
                              "Default: the profile's on_hang, stop.")


def hang_timeout_choice(value: Optional[int]) -> Optional[int]:
    """--hang-timeout, checked: 0 (off) or 5 seconds and more."""
    if value is not None and 0 < value < 5:
        raise UsageError(f"--hang-timeout {value}: too short to tell a hang from a pause",
                         "give 5 seconds or more (e.g. 600), or 0 to turn the watchdog off")
    return value


def on_hang_choice(value: Optional[str]) -> Optional[str]:
    """--on-hang, checked."""
    if value is not None and value not in ("stop", "keep"):
        raise UsageError(f"--on-hang {value!r}: not stop or keep", "give --on-hang stop or --on-hang keep")
    return value


def train_overrides(*, fsdp: Optional[int] = None, preset: Optional[str] = None, steps: Optional[int] = None,
                    epochs: Optional[int] = None, batch_size: Optional[int] = None, sharding: Optional[str] = None,
                    mixed_precision: Optional[str] = None, settings: Optional[list[str]] = None) -> dict[str, Any]:
    """Workload settings from flags, checked like the profile's ``train`` section."""
    from ..workload import config as train_config

    values: dict[str, Any] = {}
    for item in settings or []:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or not name:
            raise UsageError(f"--set {item!r}: expected NAME=VALUE", "write e.g. --set lr=0.001")
        values[name] = _parse_setting(name, text)
    flags = {"fsdp": fsdp, "preset": preset, "steps": steps, "epochs": epochs, "batch_size": batch_size,
             "sharding": sharding, "mixed_precision": mixed_precision}
    values.update({name: value for name, value in flags.items() if value is not None})
    for name, value in list(values.items()):
        try:
            values[name] = train_config.coerce_value(name, value)
        except train_config.ConfigError as exc:
            raise UsageError(f"{train_config.flag_name(name)}: {exc.problem}", exc.fix) from None
    if values.get("steps") is not None and epochs is None:
        values.setdefault("epochs", None)  # a --steps flag replaces the profile's epochs
    if values.get("epochs") is not None and steps is None:
        values.setdefault("steps", None)
    return values


def _parse_setting(name: str, text: str) -> Any:
    """``--set`` values are written like YAML scalars: numbers, true/false, null, or text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        lowered = text.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered in ("none", "null"):
            return None
        return text


def build_plan(profile_name: str, overrides: Overrides, *, for_slurm: bool) -> tuple[LoadedProfile, LaunchPlan]:
    """Load the profile and compute the plan with a fresh run id."""
    from ..plan.make import make_plan
    from ..profiles.loader import load_profile
    from ..runs.paths import new_run_id, runs_root

    loaded = load_profile(profile_name)
    run_id = new_run_id(loaded.profile.name)
    plan = make_plan(loaded.profile, run_id=run_id, local_run_dir=str(runs_root() / run_id),
                     overrides=overrides, **plan_inputs(loaded, for_slurm))
    return loaded, plan


def plan_inputs(loaded: LoadedProfile, for_slurm: bool) -> dict[str, Any]:
    """make_plan's inputs from this process (besides the profile, run id and overrides): kept with
    the run, so a later attempt is planned exactly as the first one was."""
    return {"profile_source": str(loaded.path), "local_python": sys.executable, "home": str(Path.home()),
            "local_cwd": str(Path.cwd()), "for_slurm": for_slurm}


def with_previews(profile, plan: LaunchPlan, scripts: dict[str, str]) -> dict[str, str]:
    """The rendered scripts plus whatever the backend would write itself (shown by ``--dry-run``)."""
    from ..backends import backend_for

    return {**scripts, **backend_for(profile, plan.backend).previews(plan, scripts)}


@contextlib.contextmanager
def opened_run(run_id: Optional[str]) -> Iterator[tuple[Run, Backend]]:
    """A run (the latest when ``run_id`` is None) and its backend, closed afterwards."""
    from ..backends import backend_for_run
    from ..runs.paths import find_run
    from ..runs.record import load_run

    run = load_run(find_run(run_id))
    backend = backend_for_run(run)
    try:
        yield run, backend
    finally:
        backend.close()
