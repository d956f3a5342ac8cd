"""From a profile and the options to a plan ready to start: the job resolved, the plan made and its
scripts rendered, nothing touched yet (``--dry-run`` stops here)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from ..errors import UsageError
from .options import JobOptions, workload_settings

if TYPE_CHECKING:
    from ..backends.base import Backend
    from ..bundle import Payload
    from ..hostpool.choice import HostChoice
    from ..job import Job
    from ..plan.types import LaunchPlan, Overrides
    from ..profiles.loader import LoadedProfile
    from ..profiles.schema import ClusterProfile, HostSpec
    from ..rundir.status import Replacement, Resize

ProfileLike = Union[str, "os.PathLike[str]", "LoadedProfile"]
"""A profile's name (``./cluster_profiles``, ``~/.config/fsdpctl/profiles``, shipped), a path to a
.yaml file, or a profile ``load_profile`` returned."""


def load_profile(profile: ProfileLike) -> LoadedProfile:
    """A cluster profile, validated: by name, by path, or as already loaded."""
    from ..profiles.loader import LoadedProfile
    from ..profiles.loader import load_profile as load

    if isinstance(profile, LoadedProfile):
        return profile
    if isinstance(profile, os.PathLike):
        profile = os.fspath(profile)
        if not profile.endswith((".yaml", ".yml")) and "/" not in profile:
            profile = "./" + profile
    if not isinstance(profile, str):
        raise UsageError(f"profile {profile!r}: not a name, a path or a loaded profile",
                         "pass e.g. 'two-node', 'cluster_profiles/lab.yaml' or fsdpctl.load_profile(...)")
    return load(profile)


@dataclass(frozen=True)
class Prepared:
    """A plan ready to start: the profile, the plan, its scripts and the job behind it."""

    loaded: LoadedProfile
    plan: LaunchPlan
    scripts: dict[str, str]
    job: Job
    inputs: dict[str, Any]
    """What the plan was made from (kept with the run as inputs.json)."""
    warnings: tuple[str, ...] = ()
    """What the caller should hear before it starts (a credential passed as a plain variable)."""
    replacements: tuple[Replacement, ...] = ()
    """Spares the run uses in the place of excluded hosts (remembered, or ``--exclude``)."""
    placed_hosts: tuple[HostSpec, ...] = ()
    """The hosts the run uses, spares in place (a backend that takes spares)."""
    spares: tuple[HostSpec, ...] = ()
    """The spares left, checked by the preflight too."""
    placed_profile: Optional[ClusterProfile] = None
    """The profile the plan was made from, its hosts placed (spares in place); None: ``loaded``'s."""
    resize: Optional[Resize] = None
    """An elastic run that starts short of its hosts (excluded, no spare left): how short, and why."""

    @property
    def queued(self) -> bool:
        """Its backend is a scheduler's: it is submitted (``submit``), not launched."""
        from ..backends import backend_class

        return backend_class(self.plan.backend).queued

    def payload(self) -> Payload:
        """What every node gets: the tar (scripts, workload package, code) and the secrets' values,
        read now from this environment (a missing one is a one-line error before anything starts)."""
        from ..bundle import Payload, node_payload
        from ..job import secret_values

        return Payload(node_payload(self.scripts, self.job.code), secret_values(self.plan.secrets))

    def with_env(self, extra: dict[str, str]) -> Prepared:
        """The same run (its run id, hosts and settings) with ``extra`` variables for every rank: the
        plan made again and its scripts rendered again. They go into the inputs' overrides too, so
        every later attempt (planned from inputs.json) and every restart gets them as well."""
        import dataclasses

        from ..backends import backend_class
        from ..plan.make import make_plan
        from ..plan.types import overrides_from_json, overrides_to_json

        overrides = overrides_from_json(self.inputs["overrides"])
        overrides = dataclasses.replace(overrides, extra_env={**overrides.extra_env, **extra})
        placer = backend_class(self.plan.backend)
        plan = make_plan(self.placed_profile or self.loaded.profile, placer=placer, run_id=self.plan.run_id,
                         local_run_dir=self.plan.local_run_dir, profile_source=self.inputs["profile_source"],
                         overrides=overrides, local_python=self.inputs["local_python"], home=self.inputs["home"],
                         local_cwd=self.inputs["local_cwd"])
        inputs = {**self.inputs, "overrides": overrides_to_json(overrides)}
        return dataclasses.replace(self, plan=plan, scripts=placer.scripts(plan), inputs=inputs)

    def previews(self) -> dict[str, str]:
        """The rendered scripts plus whatever the backend would write itself (what ``--dry-run`` shows)."""
        from ..backends import backend_for

        return {**self.scripts, **backend_for(self.loaded.profile, self.plan.backend).previews(self.plan, self.scripts)}


def plan_inputs(loaded: LoadedProfile) -> dict[str, Any]:
    """make_plan's inputs from this process (besides the profile, run id and overrides): kept with
    the run, so a later attempt is planned exactly as the first one was."""
    from ..plan.types import PlanContext

    return {"profile_source": str(loaded.path), **PlanContext.here(loaded.name).inputs()}


def build_plan(loaded: LoadedProfile, overrides: Overrides, *, backend: Optional[str] = None,
               runs_dir: Optional[Path] = None, profile: Optional[ClusterProfile] = None) -> LaunchPlan:
    """The plan of a new run of ``loaded`` through ``backend`` (default: the profile's) with a fresh run
    id; ``profile``: the profile as placed (its hosts with spares in place), default ``loaded``'s."""
    from ..backends import backend_class
    from ..plan.make import make_plan
    from ..rundir.paths import new_run_id, runs_root

    run_id = new_run_id(loaded.profile.name, runs_dir or runs_root())
    return make_plan(profile or loaded.profile, placer=backend_class(backend or loaded.profile.backend), run_id=run_id,
                     local_run_dir=str((runs_dir or runs_root()) / run_id), overrides=overrides,
                     **plan_inputs(loaded))


def backend_options(placer: type[Backend], options: JobOptions, job: Job) -> dict[str, Any]:
    """The settings of the backend that runs the job (a scheduler's nodes, time limit...): those given
    as options, then the job file's; an option the backend does not take is refused in one line."""
    given = {"nodes": options.nodes, "time": options.time, "partition": options.partition,
             "requeue": options.requeue, "via": options.via, "spares": options.spares}
    refused = [name for name, value in given.items() if value is not None and name not in placer.options]
    if refused:
        raise UsageError(f"{'/'.join(refused)}: settings of a scheduler, and {placer.name} takes "
                         f"{', '.join(placer.options) or 'none'}",
                         "submit it through one (fsdpctl submit --slurm), or drop them")
    from_job = {"nodes": job.nodes, "time": job.time, "spares": job.spares}
    return {name: value for name in placer.options
            if (value := given.get(name) if given.get(name) is not None else from_job.get(name)) is not None}


def environment_of(loaded: LoadedProfile, job: Any, options: JobOptions) -> Optional[Any]:
    """The environment the nodes make (an EnvPlan): ``--env-from`` over the job file's section over the
    profile's; None without one. Not with a container: an image holds its own."""
    from ..environment.inputs import env_plan_of, spec_from_flag

    spec = spec_from_flag(options.env_from, job.environment or loaded.profile.environment)
    if spec is None:
        return None
    if job.container or loaded.profile.container is not None:
        raise UsageError("environment: beside a container, whose image holds its own environment",
                         "drop --container (or the environment), or build the image from your lock")
    where = "--env-from" if options.env_from else "job: environment" if job.environment else \
        f"{loaded.path}: environment"
    return env_plan_of(spec, loaded.path.parent, where)


def with_container(loaded: LoadedProfile, image: Optional[str]) -> LoadedProfile:
    """The profile with ``image`` (``--container``) over its ``container.image`` (a container section
    of the default runtime when it has none)."""
    if not image:
        return loaded
    import dataclasses

    from ..profiles.schema import ContainerSpec

    if not ContainerSpec.image_ok(image):
        raise UsageError(f"--container: {image!r} is not an image name",
                         "give a reference such as nvcr.io/nvidia/pytorch:25.01-py3, or a .sif path for apptainer")
    current = loaded.profile.container
    container = dataclasses.replace(current, image=image) if current else ContainerSpec(image=image)
    return dataclasses.replace(loaded, profile=dataclasses.replace(loaded.profile, container=container))


def short_start(profile: ClusterProfile, placed: Optional[HostChoice], exclude: tuple[str, ...]) -> Optional[Resize]:
    """The resize of an elastic run that starts with hosts missing (None: it has them all)."""
    if placed is None or not placed.missing:
        return None
    from ..hostpool.choice import reasons
    from ..hostpool.placing import excluded_hosts
    from ..rundir.status import Resize

    why = reasons(placed.missing, excluded_hosts(profile, exclude))
    return Resize(nodes=len(placed.hosts), before=placed.full, full=placed.full, hosts=placed.missing, why=why)


def prepare_run(profile: Optional[ProfileLike], options: JobOptions, *, backend: Optional[str] = None,
            runs_dir: Optional[Path] = None) -> Prepared:
    """Resolve the job, refuse workload settings next to a command of the user's, build and render
    the plan (through ``backend``; default: the profile's). ``profile`` may be None when the job
    file names one."""
    from ..backends import backend_class
    from ..job import check_script, credential_like, resolve_job
    from ..plan.types import Overrides, overrides_to_json

    job = resolve_job(options, Path.cwd())
    if job.command and options.workload:
        name = next(iter(options.workload))
        raise UsageError(f"--{name.replace('_', '-')}: a setting of the bundled workload, and your own program "
                         f"runs instead", "pass your program's own arguments after --, e.g. -- train.py --epochs 3")
    if job.code is not None:
        check_script(job.command, job.code)
    train = {} if job.command else workload_settings(options.workload)
    if profile is None and job.profile is None:
        raise UsageError("--profile: missing", "name the cluster: -p PROFILE (or profile: in the job file)")
    loaded = load_profile(profile if profile is not None else job.profile)  # type: ignore[arg-type]
    placer = backend_class(backend or loaded.profile.backend)
    overrides = Overrides(
        train=train, command=job.command, code=job.code.plan() if job.code else None, chdir=job.chdir,
        requirements=job.requirements, extra_env=job.env, secrets=job.secrets,
        nproc_per_node=options.nproc_per_node if options.nproc_per_node is not None else job.nproc_per_node,
        master_port=options.master_port, debug=options.debug, node_timeout=options.node_timeout,
        hang_timeout=options.hang_timeout, on_hang=options.on_hang, max_restarts=options.max_restarts,
        allow_busy_gpus=options.allow_busy_gpus, container_image=job.container,
        tensorboard=options.tensorboard, prometheus=options.prometheus, telemetry=options.telemetry,
        tokens_per_step=options.tokens_per_step, flops_per_token=options.flops_per_token,
        min_nodes=options.min_nodes, backend_options=backend_options(placer, options, job),
        environment=environment_of(loaded, job, options))
    loaded = with_container(loaded, job.container)  # the backend's probes ask inside the same image
    if job.notify is not None:  # the job file's notices in the place of the profile's
        loaded = dataclasses.replace(loaded, profile=dataclasses.replace(loaded.profile, notify=job.notify))
    if placer.queued and overrides.max_restarts:
        raise UsageError(f"--max-restarts: {placer.name} requeues a job itself", "use requeue=True (--requeue) instead")
    from ..hostpool.placing import place_hosts
    from ..plan.elastic import min_nodes_of

    min_nodes = min_nodes_of(loaded.profile, overrides)
    if overrides.min_nodes and placer.takes_spares and loaded.profile.max_restarts < 1 and not options.max_restarts:
        raise UsageError(f"--min-nodes {overrides.min_nodes}: a run goes on with fewer nodes by a restart, and "
                         f"max_restarts is 0", "add --max-restarts 3 (or set max_restarts in the profile)")
    placed = place_hosts(loaded.profile, options.exclude, min_nodes) if placer.takes_spares else None
    if options.exclude and placed is None:
        raise UsageError(f"--exclude: {placer.name} does not run on hosts the profile names", "drop --exclude")
    if placed is not None and placed.missing:  # an elastic run that starts short of its hosts
        from dataclasses import replace

        overrides = replace(overrides, full_nodes=placed.full)
    plan = build_plan(loaded, overrides, backend=placer.name, runs_dir=runs_dir,
                      profile=placed.profile if placed is not None else None)
    warnings = tuple(f"{name} looks like a credential and is written into the run's scripts and records; pass it "
                     f"as a secret instead (--env {name}, or secrets: [{name}])"
                     for name in credential_like({**loaded.profile.env, **job.env}))
    from ..live.exports import missing_writers

    warnings += tuple(f"{said}; the run goes on without it" for said in missing_writers(plan.export or {}))
    inputs = {**plan_inputs(loaded), "overrides": overrides_to_json(overrides), "exclude": list(options.exclude)}
    if job.notify is not None:  # a detached run's follower and a resume read it back (notify_spec_of)
        inputs["notify"] = dataclasses.asdict(job.notify)
    if placed is None:
        return Prepared(loaded, plan, placer.scripts(plan), job, inputs, warnings)
    warnings += tuple(f"{r.by} runs in the place of {r.host}, excluded: {r.why}" for r in placed.replacements)
    short = short_start(loaded.profile, placed, options.exclude)
    if short is not None:
        warnings += (f"elastic (min_nodes {min_nodes}): the run starts short and {short.describe()}; it grows "
                     f"back at a checkpoint once the host is restored (`fsdpctl hosts -p {loaded.name} --restore "
                     f"HOST`)",)
    return Prepared(loaded, plan, placer.scripts(plan), job, inputs, warnings, placed.replacements,
                    placed.profile.hosts, placed.profile.spares, placed.profile, short)
