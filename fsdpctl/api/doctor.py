"""``doctor``: check every host of a profile and diff them, before a job hangs on it; with ``health``,
their hardware in full; with ``collectives``, ``compute`` and ``links``, measured runs through the
launch path (``doctor_runs``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from .events import Emitter, EventHandler, HostChecked
from .options import PathLike
from .prepare import ProfileLike, load_profile, with_container

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..hostcheck.checks import DoctorReport
    from ..profiles.loader import LoadedProfile


def doctor(profile: ProfileLike, *, deep: bool = False, timeout: float = 20.0, concurrency: int = 1024,
           port_check: bool = True, requirements: Union[PathLike, Sequence[str], None] = None,
           collectives: bool = False, health: bool = False, allow_busy_gpus: Optional[bool] = None,
           exclude_unhealthy: bool = False, compute: bool = False, links: bool = False,
           container: Optional[str] = None, on_event: Optional[EventHandler] = None,
           runs_dir: Optional[PathLike] = None) -> DoctorReport:
    """Probe every host of ``profile`` (over SSH; for a Slurm profile, the controller and partition,
    then nodes allocated with srun) and diff them: Python, torch, CUDA, NCCL, driver, GPUs, the
    interface, InfiniBand, the rendezvous port, disk, and (unless the profile's ``health.preflight``
    is off) every GPU's faults and the processes already on it. The report has ``.ok``, ``.hosts``
    (each host's facts and checks), ``.parity`` and ``.to_json()``. ``deep``: import torch on every
    host. ``requirements``: a requirements.txt path, or requirement lines, every node must meet.
    ``health``: the hardware in full (nvidia-smi's faults and limits, XID errors in the kernel log,
    ``dcgmi diag -r 1`` where DCGM is installed, InfiniBand error counters); ``allow_busy_gpus``:
    another process on a GPU only warns (default: the profile's ``health.allow_busy_gpus``);
    ``exclude_unhealthy``: a host with a hardware fault is excluded from the profile's runs (as
    ``fsdpctl hosts --exclude``; a spare takes its place). When the checks pass, as short runs of
    their own through the launch path: ``collectives`` times all-reduce and all-gather over every
    node (``report.collectives``); ``compute`` times a matmul on every rank at once and names the
    slow ones (``report.compute``); ``links`` measures every pair of nodes and names the slow link
    (``report.links``). ``container``: the image to probe inside (over the profile's
    ``container.image``). Each host's verdict reaches ``on_event`` as it arrives."""
    from ..backends import backend_for
    from ..backends.base import DoctorRequest
    from ..container.runtime import probe_timeout
    from ..hostcheck.fanout import health_args
    from ..hostcheck.requirements import read_requirements
    from ..job import Job, JobOptions
    from ..plan.make import auto_port, container_plan
    from ..rundir.paths import new_run_id
    from ..workload import REQUIREMENTS
    from .prepare import environment_of

    loaded = with_container(load_profile(profile), container)
    prof = loaded.profile
    emit = Emitter(on_event)
    if isinstance(requirements, (str, os.PathLike)):
        lines: tuple[str, ...] = read_requirements(Path(requirements))
    else:
        lines = tuple(requirements or ())
    port = prof.rendezvous.port if isinstance(prof.rendezvous.port, int) else auto_port(new_run_id(prof.name))
    nproc = prof.nproc_per_node if isinstance(prof.nproc_per_node, int) else None
    busy = prof.health.allow_busy_gpus if allow_busy_gpus is None else allow_busy_gpus
    timeout = probe_timeout(container_plan(prof), max(timeout, HEALTH_TIMEOUT) if health else timeout)
    request = DoctorRequest(port=port, deep=deep, timeout=timeout,
                            concurrency=concurrency, port_check=port_check, nproc=nproc,
                            requirements=(*REQUIREMENTS, *lines),
                            extra=health_args(health, busy, prof.health.preflight),
                            environment=environment_of(loaded, Job(), JobOptions()))
    backend = backend_for(prof)
    try:
        report = backend.doctor(request, on_host=lambda host: emit(HostChecked(host)))
        remember(prof.name, report, "doctor --health" if health else "doctor")
        if exclude_unhealthy:
            exclude_faulty_hosts(prof, report, emit)
        measured_checks(loaded, backend, emit, report, runs_dir,
                        [n for n, wanted in (("collectives", collectives), ("compute", compute), ("links", links))
                         if wanted])
    finally:
        backend.close()
    return report


def remember(profile_name: str, report: DoctorReport, by: str) -> None:
    """Each host's newest check, kept for the dashboard's hosts page."""
    from ..hostpool.findings import remember_findings
    from ..rundir.record import now

    remember_findings(profile_name, report.to_json(), by, now())


HEALTH_TIMEOUT = 180.0
"""Seconds a host's probe may take with ``health``: ``dcgmi diag -r 1`` alone may take a minute."""
HARDWARE_CHECKS = ("gpu-health", "xid", "dcgm")
"""The checks whose failure is the host's hardware (a busy GPU is not: it frees up)."""


def exclude_faulty_hosts(profile, report: DoctorReport, emit: Emitter) -> None:
    """Exclude every host whose hardware failed a check from the profile's runs; say what and why."""
    from ..errors import UsageError
    from .hosts import exclude_host

    for host in report.hosts:
        faults = [c for c in host.checks if c.status == "fail" and c.name in HARDWARE_CHECKS]
        if not faults:
            continue
        reason = f"doctor --health: {faults[0].detail}" + (f" (and {len(faults) - 1} more)" if len(faults) > 1 else "")
        try:
            exclude_host(profile, host.host, reason)
        except UsageError as exc:
            emit.notice(f"doctor: {host.host} not excluded: {exc}", "warning")
        else:
            emit.notice(f"doctor: {host.host} excluded from profile {profile.name} ({reason}); "
                        f"`fsdpctl hosts --restore {host.host}` puts it back once fixed", "warning")


def measured_checks(loaded: LoadedProfile, backend: Backend, emit: Emitter, report: DoctorReport,
                    runs_dir: Optional[PathLike], names: Sequence[str]) -> None:
    """Each measured check asked for, as a run of its own, once the checks above pass."""
    from .doctor_runs import add_compute_checks, add_link_checks, measured_run, run_measured

    device = backend.profile.device
    for name in names:
        if not report.ok:
            setattr(report, name, {"skipped": "the checks above failed"})
            continue
        found = run_measured(loaded, backend, emit, measured_run(name, device), runs_dir)
        setattr(report, name, found)
        if name == "compute" and "ranks" in found:
            add_compute_checks(report, found)
        elif name == "links" and "pairs" in found:
            add_link_checks(report, found)
