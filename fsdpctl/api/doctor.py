"""``doctor``: check every host of a profile and diff them, before a job hangs on it; with
``collectives``, time all-reduce and all-gather over every node through the launch path."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from .events import Emitter, EventHandler, HostChecked
from .options import PathLike
from .prepare import ProfileLike, load_profile

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..hostcheck.checks import DoctorReport
    from ..profiles.loader import LoadedProfile


def doctor(profile: ProfileLike, *, deep: bool = False, timeout: float = 20.0, concurrency: int = 32,
           port_check: bool = True, requirements: Union[PathLike, Sequence[str], None] = None,
           collectives: bool = False, on_event: Optional[EventHandler] = None,
           runs_dir: Optional[PathLike] = None) -> DoctorReport:
    """Probe every host of ``profile`` (over SSH; for a Slurm profile, the controller and partition,
    then nodes allocated with srun) and diff them: Python, torch, CUDA, NCCL, driver, GPUs, the
    interface, InfiniBand, the rendezvous port, disk. The report has ``.ok``, ``.hosts`` (each
    host's facts and checks), ``.parity`` and ``.to_json()``. ``deep``: import torch on every host.
    ``requirements``: a requirements.txt path, or requirement lines, every node must meet.
    ``collectives``: when the checks pass, also time collectives over every node, as a short run of
    its own (``report.collectives``). Each host's verdict reaches ``on_event`` as it arrives."""
    from ..backends import backend_for
    from ..backends.base import DoctorRequest
    from ..hostcheck.requirements import read_requirements
    from ..plan.make import auto_port
    from ..rundir.paths import new_run_id
    from ..workload import REQUIREMENTS

    loaded = load_profile(profile)
    prof = loaded.profile
    emit = Emitter(on_event)
    if isinstance(requirements, (str, os.PathLike)):
        lines: tuple[str, ...] = read_requirements(Path(requirements))
    else:
        lines = tuple(requirements or ())
    port = prof.rendezvous.port if isinstance(prof.rendezvous.port, int) else auto_port(new_run_id(prof.name))
    nproc = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else None
    request = DoctorRequest(port=port, deep=deep, timeout=timeout, concurrency=concurrency, port_check=port_check,
                            nproc=nproc, requirements=(*REQUIREMENTS, *lines))
    backend = backend_for(prof)
    try:
        report = backend.doctor(request, on_host=lambda host: emit(HostChecked(host)))
        if collectives:
            report.collectives = (run_collectives(loaded, backend, emit, runs_dir) if report.ok
                                  else {"skipped": "the checks above failed"})
    finally:
        backend.close()
    return report


def run_collectives(loaded: LoadedProfile, backend: Backend, emit: Emitter,
                    runs_dir: Optional[PathLike] = None) -> dict[str, Any]:
    """The collective smoke test through the launch path, as a run of its own; its figures (or why not)."""
    from ..bundle import Payload, node_payload
    from ..hostcheck.collectives import COLLECTIVES_ENV, COLLECTIVES_MODULE, collectives_result
    from ..plan.types import Overrides
    from ..rundir.rundir import create_run
    from .prepare import build_plan

    device = "cpu" if backend.profile.device == "cpu" else backend.profile.device
    overrides = Overrides(entry_module=COLLECTIVES_MODULE, entry_args=("--device", device),
                          extra_env=COLLECTIVES_ENV)
    plan = build_plan(loaded, overrides, backend=backend.name,
                      runs_dir=Path(runs_dir) if runs_dir is not None else None)
    scripts = backend.scripts(plan)
    lines: list[str] = []
    emit.notice(f"doctor: collective smoke test as run {plan.run_id}")
    run = create_run(plan, loaded.profile, scripts, loaded.text)
    follower = backend.start(run, Payload(node_payload(scripts)), detached=False)
    outcome = follower.follow(lambda line: lines.append(line.text))
    found = collectives_result(lines)
    if outcome.exit_code or found is None:
        return {"run_id": plan.run_id, "error": f"the smoke test exited {outcome.exit_code}",
                "last_lines": lines[-15:]}
    return {"run_id": plan.run_id, **found}
