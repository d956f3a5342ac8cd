"""The user's job as one value: their command, the code that goes with it, its environment and
requirements, from a job file (``--job``) and the command line (flags win over the file).

Without a command the bundled workload runs, and none of this applies.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

from .errors import UsageError

if TYPE_CHECKING:  # the code collector loads when a job has code: `import fsdpctl` stays light
    from .bundle import CodeManifest


@dataclass(frozen=True, kw_only=True)
class JobOptions:
    """Everything a run is made of besides its profile (None: the profile's, or the default)."""

    command: tuple[str, ...] = ()
    """Your program and its arguments; empty: the bundled workload."""
    job: Optional[str] = None
    """A job file (``./jobs/NAME.yaml`` or a path) with command, code, env, requirements; options win."""
    code: Optional[Path] = None
    """The folder copied to every node for your program (default: the current folder)."""
    no_code: bool = False
    """Copy no code: the ranks start in ``chdir``, on storage every node has."""
    chdir: Optional[str] = None
    code_limit_mb: Optional[int] = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables for every rank, written into the run's scripts."""
    secrets: tuple[str, ...] = ()
    """Names of variables whose values are read from this environment when the run starts and reach
    the ranks only (never a file, a command line or a log)."""
    requirements: Optional[Path] = None
    """A requirements.txt every node must meet, with the same versions everywhere."""
    env_from: Optional[Path] = None
    """A uv.lock, pyproject.toml or requirements.txt: the environment made on every node, over the
    profile's (or the job file's) ``environment.file``."""
    workload: Mapping[str, Any] = field(default_factory=dict)
    """Settings of the bundled workload (``fsdp=2, steps=20, lr=1e-3``); not with a command."""
    nproc_per_node: Optional[int] = None
    master_port: Optional[int] = None
    debug: bool = False
    """Add NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=ALL, TORCH_DISTRIBUTED_DEBUG=DETAIL."""
    node_timeout: Optional[int] = None
    hang_timeout: Optional[int] = None
    """Seconds without progress before the run counts as hung (0: no watchdog)."""
    on_hang: Optional[str] = None
    """``stop`` (end the run, exit 124) or ``keep`` (report and let it run)."""
    max_restarts: Optional[int] = None
    allow_busy_gpus: Optional[bool] = None
    """Start even when other processes already use a GPU (default: the profile's ``health.allow_busy_gpus``)."""
    container: Optional[str] = None
    """The image the ranks run in on every node (over the profile's ``container.image``)."""
    tensorboard: Optional[str] = None
    """A folder here: the run's TensorBoard event files go into ``<folder>/<run_id>/`` (over
    ``export.tensorboard``)."""
    prometheus: Optional[str] = None
    """A Prometheus textfile (or a folder for one) kept while the run goes (over ``export.prometheus``)."""
    telemetry: Optional[bool] = None
    """Your program: every rank's steps, loss and times from fsdpctl's start-up hook (default: the
    profile's ``telemetry.enabled``)."""
    tokens_per_step: Optional[int] = None
    """Your program's tokens per optimizer step over all ranks (default: the profile's
    ``telemetry.tokens_per_step``; else estimated)."""
    flops_per_token: Optional[float] = None
    """Your model's training FLOPs per token, for its MFU (default: the profile's ``telemetry.flops_per_token``)."""
    exclude: tuple[str, ...] = ()
    """Hosts of the profile this launch leaves out (a spare takes each one's place)."""
    min_nodes: Optional[int] = None
    """An elastic run: the fewest nodes it goes on with when a node is to blame and no spare is left
    (over the profile's ``elastic.min_nodes``; 0: not elastic)."""
    nodes: Optional[int] = None
    """Slurm: nodes to allocate."""
    time: Optional[str] = None
    """Slurm: the time limit (``02:00:00``)."""
    partition: Optional[str] = None
    via: Optional[str] = None
    """Slurm: ``sbatch`` (fsdpctl's batch script) or ``submitit``."""
    requeue: Optional[bool] = None
    """Slurm: checkpoint before the time limit and requeue."""
    spares: Optional[int] = None
    """Slurm: spare nodes the job holds beyond ``nodes``, to continue on when a node fails."""
    model: Optional[str] = None
    """Your program's model for the memory check before it starts (``package.module:factory``; see
    ``fsdpctl estimate --model``); the bundled workload is checked without it."""
    wrap: Optional[str] = None
    """With ``model``: the class FSDP shards."""
    input_shape: tuple[Union[int, str], ...] = ()
    """With ``model``: its input's shape, ``B`` for the batch."""

    def __post_init__(self) -> None:
        check_hang_timeout(self.hang_timeout)
        if self.on_hang is not None and self.on_hang not in ("stop", "keep"):
            raise UsageError(f"--on-hang {self.on_hang!r}: not stop or keep", "give --on-hang stop or --on-hang keep")
        if self.node_timeout is not None and self.node_timeout < 3:
            raise UsageError(f"--node-timeout {self.node_timeout}: too short", "give 3 seconds or more (default 30)")
        if self.max_restarts is not None and not 0 <= self.max_restarts <= 100:
            raise UsageError(f"--max-restarts {self.max_restarts}: out of range", "give 0 to 100")
        if self.min_nodes is not None and self.min_nodes < 0:
            raise UsageError(f"--min-nodes {self.min_nodes}: negative", "give the fewest nodes to go on with (0: off)")
        if self.tokens_per_step is not None and self.tokens_per_step < 1:
            raise UsageError(f"--tokens-per-step {self.tokens_per_step}: not positive",
                             "give the tokens of one optimizer step over all ranks (global batch x sequence length)")
        if self.flops_per_token is not None and self.flops_per_token <= 0:
            raise UsageError(f"--flops-per-token {self.flops_per_token}: not positive",
                             "give your model's training FLOPs per token (about 6 x its parameters)")
        check_slurm_values(self.nodes, self.time, self.partition, self.via, self.spares)


def check_hang_timeout(value: Optional[int]) -> Optional[int]:
    """0 (off) or 5 seconds and more."""
    if value is not None and (value < 0 or 0 < value < 5):
        raise UsageError(f"--hang-timeout {value}: too short to tell a hang from a pause",
                         "give 5 seconds or more (e.g. 600), or 0 to turn the watchdog off")
    return value


def check_slurm_values(nodes: Optional[int], time: Optional[str], partition: Optional[str],
                       via: Optional[str], spares: Optional[int] = None) -> None:
    from .profiles.schema import SLURM_TIME_PATTERN, SLURM_WORD_PATTERN

    if nodes is not None and nodes < 1:
        raise UsageError(f"--nodes {nodes}: not positive", "give 1 or more")
    if spares is not None and spares < 0:
        raise UsageError(f"--spares {spares}: negative", "give 0 or more spare nodes")
    if time is not None and not SLURM_TIME_PATTERN.match(time):
        raise UsageError(f"--time {time!r}: not a Slurm time limit", "write e.g. 90, 02:00:00 or 1-00:00")
    if partition is not None and not SLURM_WORD_PATTERN.match(partition):
        raise UsageError(f"--partition {partition!r}: not a partition name", "use letters, digits, _ - .")
    if via is not None and via not in ("sbatch", "submitit"):
        raise UsageError(f"--via {via!r}: unknown", "use --via sbatch or --via submitit")


@dataclass(frozen=True)
class Job:
    """The resolved job."""

    command: tuple[str, ...] = ()
    profile: Optional[str] = None
    code: Optional[CodeManifest] = None
    chdir: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    """Names of variables whose values come from the launcher's environment."""
    requirements: tuple[str, ...] = ()
    nproc_per_node: Optional[int] = None
    nodes: Optional[int] = None
    time: Optional[str] = None
    spares: Optional[int] = None
    fetch: tuple[str, ...] = ()
    model: Optional[str] = None
    """The program's model for the memory check before a launch (with ``wrap`` and ``input_shape``)."""
    wrap: Optional[str] = None
    input_shape: tuple[Union[int, str], ...] = ()
    container: Optional[str] = None
    """The image the ranks run in (``--container``, else the job file's)."""
    notify: Optional[Any] = None
    """The job file's ``notify`` section (a NotifySpec), in the place of the profile's."""
    environment: Optional[Any] = None
    """The job file's ``environment`` section (an EnvironmentSpec, its file made absolute)."""


def parse_env_items(items: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
    """``--env`` items, checked like a profile's ``env``: (variables with their values, secret names).
    ``NAME=VALUE`` is written into the run's scripts; a bare ``NAME`` is a secret, its value taken
    from this environment at launch and written nowhere (as ``docker run -e NAME``)."""
    env: dict[str, str] = {}
    secrets: list[str] = []
    for item in items:
        name, sep, value = item.partition("=")
        from .profiles.schema import env_name_problem

        if problem := env_name_problem(name):
            raise UsageError(f"--env {name}: {problem[0]}", problem[1])
        if not sep:
            secrets.append(name)
            continue
        if "\0" in value:
            raise UsageError(f"--env {name}: the value contains a NUL byte", "remove it")
        env[name] = value
    return env, tuple(secrets)


def secret_values(names: tuple[str, ...], environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """The secrets' values from the environment fsdpctl runs in; a missing one is a usage error."""
    import os

    environ = os.environ if environ is None else environ
    for name in names:
        if name not in environ:
            raise UsageError(f"secret {name}: not set in the environment fsdpctl runs in",
                             f"export {name}=... in this shell (its value is passed to the ranks and written "
                             f"nowhere), or drop it from --env / secrets:")
    return {name: environ[name] for name in names}


def credential_like(env: dict[str, str]) -> list[str]:
    """Plain variables whose names say credential: they would be written into the run's files."""
    from .profiles.schema import looks_like_credential

    return [name for name in env if looks_like_credential(name)]


def check_script(command: tuple[str, ...], code: CodeManifest) -> None:
    """A script named first must be among the files copied to the nodes (a typo, or a file git
    ignores, would otherwise start every node only to fail in every rank)."""
    script = command[0] if command else ""
    if not script or script.startswith("-") or os.path.isabs(script):
        return  # -m MODULE: found by Python on the nodes; an absolute path: on the nodes' own storage
    relative = os.path.normpath(script)
    copied = {name for name, _ in code.files}
    if relative in copied:
        return
    on_disk = (code.root / relative).is_file()
    why = ("it is there but not copied (git ignores it, or an ignore pattern)" if on_disk
           else "no such file there")
    scripts = sorted(name for name in copied if name.endswith(".py"))
    near = [n for n in scripts if Path(n).name == Path(relative).name] or \
        difflib.get_close_matches(relative, scripts, 1)
    hint = (f"did you mean {near[0]}? Scripts are named relative to the code folder" if near else
            f"name a script inside {code.root} (relative to it), or run a module with -- -m PACKAGE.MODULE")
    raise UsageError(f"{script}: not in the code folder {code.root} ({why}); nothing was started", hint)


def resolve_job(flags: JobOptions, cwd: Path) -> Job:
    """Combine the job file (when ``--job`` is given) with the flags; collect the code to copy."""
    from .hostcheck.requirements import read_requirements
    from .profiles.jobs import load_job

    loaded = load_job(flags.job) if flags.job else None
    spec = loaded.job if loaded else None
    command = flags.command or (spec.command if spec else ())
    if flags.no_code and flags.code is not None:
        raise UsageError("--code and --no-code: give one of them", "--no-code runs the code where it already is")
    if flags.model and not (flags.wrap and flags.input_shape):
        raise UsageError("--model: the memory check also needs the class FSDP shards and the input's shape",
                         "add --wrap CLASS --input-shape B,1024 (B: the batch)")
    if not command:
        misplaced = [name for given, name in ((flags.code is not None, "--code"), (flags.no_code, "--no-code"),
                                              (flags.chdir is not None, "--chdir"), (bool(flags.model), "--model"))
                     if given]
        if misplaced:
            raise UsageError(f"{misplaced[0]}: goes with a command of your own; the bundled workload ships itself",
                             "add your program after --, e.g. -- train.py --epochs 3")
        requirements = read_requirements(flags.requirements) if flags.requirements else ()
        return Job(env=dict(flags.env), secrets=flags.secrets, requirements=requirements,
                   container=flags.container or (spec.container if spec else None),
                   environment=_job_environment(loaded))
    from .bundle import DEFAULT_CODE_LIMIT_MB, collect_code

    limit = (flags.code_limit_mb or (spec.code_limit_mb if spec else DEFAULT_CODE_LIMIT_MB)) * 1_000_000
    if flags.code is not None:
        code_dir: Optional[Path] = flags.code
    elif flags.no_code or (spec is not None and spec.code is None):
        code_dir = None
    else:
        code_dir = loaded.resolve(spec.code) if loaded and spec and spec.code else cwd
    chdir = flags.chdir or (spec.chdir if spec else None)
    if code_dir is not None and flags.chdir is not None:
        raise UsageError("--chdir: goes with --no-code (with code copied, the ranks start in its copy)",
                         "add --no-code, or drop --chdir")
    if code_dir is None and chdir is None:
        chdir = str(cwd)  # runs in place: this folder, at the same path on every node
    env = dict(spec.env) if spec else {}
    env.update(flags.env)
    secrets = tuple(dict.fromkeys((*(spec.secrets if spec else ()), *flags.secrets)))
    requirements = tuple(spec.requirements) if spec else ()
    if loaded and spec and spec.requirements_file:
        requirements += read_requirements(loaded.resolve(spec.requirements_file))
    if flags.requirements:
        requirements += read_requirements(flags.requirements)
    code = collect_code(code_dir, limit) if code_dir is not None else None
    return Job(command=tuple(command), profile=spec.profile if spec else None, code=code, chdir=chdir, env=env,
               secrets=secrets, requirements=requirements, nproc_per_node=spec.nproc_per_node if spec else None,
               nodes=spec.nodes if spec else None, time=spec.time if spec else None,
               spares=spec.spares if spec else None,
               fetch=spec.fetch if spec else (), model=flags.model, wrap=flags.wrap,
               container=flags.container or (spec.container if spec else None),
               input_shape=tuple(flags.input_shape), notify=spec.notify if spec else None,
               environment=_job_environment(loaded))


def _job_environment(loaded: Any) -> Optional[Any]:
    """The job file's environment section, its paths made absolute (they are relative to the file)."""
    spec = loaded.job.environment if loaded is not None else None
    if spec is None:
        return None
    return dataclasses.replace(spec, file=str(loaded.resolve(spec.file)) if spec.file else None,
                               find_links=tuple(link if "://" in link else str(loaded.resolve(link))
                                                for link in spec.find_links))
