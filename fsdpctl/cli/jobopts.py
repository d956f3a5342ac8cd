"""What runs: your program (after ``--``), its code, environment and requirements, or a job file; and
the one step that turns them, the profile and the workload's flags into a plan and its scripts.
Shared by launch, submit and render."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from ..errors import UsageError
from . import common

if TYPE_CHECKING:
    from ..bundle import Payload
    from ..job import Job, JobFlags
    from ..plan.types import LaunchPlan
    from ..profiles.loader import LoadedProfile

JobOpt = typer.Option(None, "--job", help="A job file (./jobs/NAME.yaml or a path): command, code, env, "
                      "requirements and defaults; flags win over it.")
CodeOpt = typer.Option(None, "--code", help="Folder copied to every node for your program (default: the current "
                       "folder); git work trees copy what git would.")
NoCodeOpt = typer.Option(False, "--no-code", help="Copy no code: the ranks start in --chdir (default: this "
                         "folder's path), which every node already has on shared storage.")
ChdirOpt = typer.Option(None, "--chdir", help="With --no-code: the folder the ranks start in on the nodes.")
CodeLimitOpt = typer.Option(None, "--code-limit", help="Refuse to copy more than this many MB of code (default 100).")
EnvOpt = typer.Option(None, "--env", help="NAME=VALUE for every rank, after the profile's env (repeatable).")
RequirementsOpt = typer.Option(None, "--requirements", help="A requirements.txt every node must meet, with the "
                               "same versions on every node (checked by the preflight).")
CommandArg = typer.Argument(None, help="Your program and its arguments, after --: SCRIPT.py ARGS... or "
                            "-m MODULE ARGS...; without one, the bundled workload runs.", show_default=False,
                            metavar="-- COMMAND")


@dataclass(frozen=True)
class Prepared:
    """A plan ready to start: the profile, the plan, its scripts and the job behind it."""

    loaded: LoadedProfile
    plan: LaunchPlan
    scripts: dict[str, str]
    job: Job
    inputs: dict[str, Any]
    """What the plan was made from (kept with the run as inputs.json)."""

    def payload(self) -> Payload:
        """What every node gets: the tar (scripts, workload package, code) and the secrets' values,
        read now from this environment (a missing one is a one-line error before anything starts)."""
        from ..bundle import Payload, node_payload
        from ..job import secret_values

        return Payload(node_payload(self.scripts, self.job.code), secret_values(self.plan.secrets))


def job_flags(command: Optional[list[str]], job: Optional[str], code: Optional[Path], no_code: bool,
              chdir: Optional[str], code_limit: Optional[int], env: Optional[list[str]],
              requirements: Optional[Path]) -> JobFlags:
    from ..job import JobFlags

    return JobFlags(command=tuple(command or ()), job=job, code=code, no_code=no_code, chdir=chdir,
                    code_limit_mb=code_limit, env=tuple(env or ()), requirements_file=requirements)


def prepare(*, profile: Optional[str], flags: JobFlags, workload: dict[str, Any], for_slurm: bool,
            **overrides: Any) -> Prepared:
    """Resolve the job, refuse workload flags next to a command of the user's, build and render the plan.
    ``workload``: the workload's own flags by name (``fsdp``, ``steps``, ``settings``...); ``overrides``:
    the other Overrides fields the command sets (nproc_per_node, master_port, debug, slurm_*)."""
    from ..job import credential_like, resolve_job
    from ..plan.render import render_all
    from ..plan.types import Overrides, overrides_to_json

    job = resolve_job(flags, Path.cwd())
    given = [name for name, value in workload.items() if value not in (None, [], ())]
    if job.command and given:
        flag = "--set" if given[0] == "settings" else "--" + given[0].replace("_", "-")
        raise UsageError(f"{flag}: a setting of the bundled workload, and your own program runs instead",
                         "pass your program's own arguments after --, e.g. -- train.py --epochs 3")
    train = {} if job.command else common.train_overrides(**workload)
    profile_name = profile or job.profile
    if profile_name is None:
        raise UsageError("--profile: missing", "name the cluster: -p PROFILE (or profile: in the job file)")
    overrides.setdefault("nproc_per_node", None)
    if overrides["nproc_per_node"] is None:
        overrides["nproc_per_node"] = job.nproc_per_node
    if for_slurm:
        overrides["slurm_nodes"] = overrides.get("slurm_nodes") or job.nodes
        overrides["slurm_time"] = overrides.get("slurm_time") or job.time
    plan_overrides = Overrides(train=train, command=job.command, code=job.code.plan() if job.code else None,
                               chdir=job.chdir, requirements=job.requirements, extra_env=job.env,
                               secrets=job.secrets, **overrides)
    loaded, plan = common.build_plan(profile_name, plan_overrides, for_slurm=for_slurm)
    for name in credential_like({**loaded.profile.env, **job.env}):
        typer.secho(f"fsdpctl: warning: {name} looks like a credential and is written into the run's scripts and "
                    f"records; pass it as a secret instead (--env {name}, or secrets: [{name}])", err=True,
                    fg="yellow")
    inputs = {**common.plan_inputs(loaded, for_slurm), "overrides": overrides_to_json(plan_overrides)}
    return Prepared(loaded, plan, render_all(plan), job, inputs)
