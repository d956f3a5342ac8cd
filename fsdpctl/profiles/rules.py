"""The rules each profile section must keep beyond its types: ranges, names safe for a shell, and
fields that only make sense together. Each rule returns (field, problem, fix) or None."""

from __future__ import annotations

import re

from . import schema
from .schema import ClusterProfile, HostSpec


def _port_problem(name: str, port: int | None):
    if port is not None and not 1 <= port <= 65535:
        return name, f"{port} is not a TCP port", "give a port between 1 and 65535"
    return None


def _host_rules(host: HostSpec):
    if not schema.HOST_PATTERN.match(host.host):
        return ("host", f"{host.host!r} is not a host name, alias or IP address",
                "use letters, digits, '.', '-' and '_' only (no spaces or shell characters)")
    if host.address is not None and not schema.HOST_PATTERN.match(host.address):
        return ("address", f"{host.address!r} is not an IP address or host name",
                "give the IP the other nodes reach this host at, e.g. 10.0.0.2")
    if host.user is not None and not schema.USER_PATTERN.match(host.user):
        return "user", f"{host.user!r} is not a valid user name", "use a plain login name"
    if gpus_problem := _gpus_rules(host):
        return gpus_problem
    if host.interface is not None and not schema.IFNAME_PATTERN.match(host.interface):
        return ("interface", f"{host.interface!r} is not a network interface name",
                "give the name `ip link` shows on that host, e.g. enp3s0 (at most 15 characters)")
    return _port_problem("port", host.port)


def _gpus_rules(host: HostSpec):
    if isinstance(host.gpus, int) and host.gpus < 0:
        return "gpus", f"{host.gpus} is negative", "give 0 or more, or the GPUs' indices: [0, 1]"
    if isinstance(host.gpus, tuple):
        if not host.gpus:
            return "gpus", "is an empty list", "give the indices of the GPUs to use, e.g. [0, 1], or leave the host out"
        if any(index < 0 for index in host.gpus):
            return "gpus", f"{list(host.gpus)} holds a negative index", "give indices as nvidia-smi numbers them"
        if len(set(host.gpus)) != len(host.gpus):
            return "gpus", f"{list(host.gpus)} names a GPU twice", "name each GPU once"
    if host.nproc is not None and host.nproc < 1:
        return "nproc", f"{host.nproc} is not positive", "give 1 or more"
    if isinstance(host.gpus, tuple) and host.nproc is not None and host.nproc > len(host.gpus):
        return ("nproc", f"{host.nproc} ranks on the {len(host.gpus)} GPU(s) of gpus {list(host.gpus)}",
                f"give nproc {len(host.gpus)} or less, or name more GPUs")
    return None


def _network_rules(net: schema.NetworkSpec):
    if net.interface is not None and not schema.IFNAME_PATTERN.match(net.interface):
        return ("interface", f"{net.interface!r} is not a network interface name",
                "give the name `ip link` shows, e.g. eth0 (at most 15 characters)")
    if net.ib_hca is not None and not net.ib:
        return "ib_hca", "is set but ib is false", "set ib: true or remove ib_hca"
    if net.ib_hca is not None and not schema.SLURM_WORD_PATTERN.match(net.ib_hca):
        return "ib_hca", f"{net.ib_hca!r} is not a list of adapters", "write e.g. mlx5_0,mlx5_1"
    return None


def _rendezvous_rules(rdzv: schema.RendezvousSpec):
    if rdzv.host is not None and not schema.HOST_PATTERN.match(rdzv.host):
        return "host", f"{rdzv.host!r} is not a host name", "name one of the profile's hosts"
    if not 30 <= rdzv.timeout <= 86400:
        return "timeout", f"{rdzv.timeout} is outside 30-86400", "give seconds, e.g. 600"
    return _port_problem("port", rdzv.port if isinstance(rdzv.port, int) else None)


def _health_rules(health: schema.HealthSpec):
    if health.sample_seconds != 0 and not 1 <= health.sample_seconds <= 3600:
        return ("sample_seconds", f"{health.sample_seconds} is outside 1-3600",
                "give seconds between samples, e.g. 5, or 0 to sample nothing")
    return None


def _telemetry_rules(telemetry: schema.TelemetrySpec):
    if telemetry.tokens_per_step is not None and telemetry.tokens_per_step < 1:
        return ("tokens_per_step", f"{telemetry.tokens_per_step} is not positive",
                "give the tokens of one optimizer step over all ranks, or leave it out to estimate them")
    if telemetry.flops_per_token is not None and telemetry.flops_per_token <= 0:
        return ("flops_per_token", f"{telemetry.flops_per_token} is not positive",
                "give your model's training FLOPs per token (about 6 x its parameters), or leave it out")
    return None


def _container_rules(container: schema.ContainerSpec):
    if not schema.ContainerSpec.image_ok(container.image):
        return ("image", f"{container.image!r} is not an image name",
                "give a reference such as nvcr.io/nvidia/pytorch:25.01-py3, or a .sif path for apptainer")
    for i, mount in enumerate(container.mounts):
        parts = mount.split(":")
        if not 2 <= len(parts) <= 3 or not all(parts[:2]) or not parts[1].startswith("/") \
                or (len(parts) == 3 and parts[2] not in ("ro", "rw")) or any(c.isspace() for c in mount):
            return (f"mounts[{i}]", f"{mount!r} is not HOST:CONTAINER[:ro]",
                    "write e.g. /data:/data or /datasets:/datasets:ro (absolute paths inside)")
    for i, option in enumerate(container.options):
        if not option.startswith("-") or any(c in option for c in "\n\0"):
            return (f"options[{i}]", f"{option!r} is not a runtime flag",
                    "give one flag per item, e.g. --shm-size=16g")
    if container.workdir is not None and not container.workdir.startswith("/"):
        return "workdir", f"{container.workdir!r} is not an absolute path", "give e.g. /workspace"
    if not container.host_python.strip() or any(c in container.host_python for c in "\n\0"):
        return "host_python", f"{container.host_python!r} is not an interpreter path", "give e.g. /usr/bin/python3"
    return None


def _ssh_rules(ssh: schema.SSHSpec):
    if ssh.user is not None and not schema.USER_PATTERN.match(ssh.user):
        return "user", f"{ssh.user!r} is not a valid user name", "use a plain login name"
    if ssh.connect_timeout <= 0:
        return "connect_timeout", f"{ssh.connect_timeout} is not positive", "give seconds, e.g. 10"
    if ssh.proxy_jump is not None and not all(
        schema.HOST_PATTERN.match(part.rsplit("@", 1)[-1].rsplit(":", 1)[0]) for part in ssh.proxy_jump.split(",")
    ):
        return "proxy_jump", f"{ssh.proxy_jump!r} is not [user@]host[:port]", "write e.g. me@bastion:22"
    return _port_problem("port", ssh.port)


def _slurm_rules(slurm: schema.SlurmSpec):
    for name in ("partition", "account", "qos", "constraint"):
        value = getattr(slurm, name)
        if value is not None and not schema.SLURM_WORD_PATTERN.match(value):
            return name, f"{value!r} has characters Slurm names do not use", "use letters, digits, _ - . , :"
    if slurm.time is not None and not schema.SLURM_TIME_PATTERN.match(slurm.time):
        return "time", f"{slurm.time!r} is not a Slurm time limit", "write e.g. \"90\", \"02:00:00\" or \"1-00:00\""
    for name in ("nodes", "gpus_per_node", "cpus_per_task"):
        value = getattr(slurm, name)
        if value is not None and value < 1:
            return name, f"{value} is not positive", "give 1 or more"
    if slurm.spares < 0:
        return "spares", f"{slurm.spares} is negative", "give 0 or more spare nodes"
    for i, directive in enumerate(slurm.directives):
        if not schema.SLURM_DIRECTIVE_PATTERN.match(directive):
            return (f"directives[{i}]", f"{directive!r} is not a --name=value sbatch option",
                    "write e.g. --mem=0 (no spaces, quotes or shell characters)")
    if not 1 <= slurm.signal_seconds <= 65535:
        return "signal_seconds", f"{slurm.signal_seconds} is outside 1-65535", "give the seconds, e.g. 120"
    return None


def _secrets_problem(secrets: tuple[str, ...], env: dict[str, str]):
    for i, name in enumerate(secrets):
        if problem := schema.env_name_problem(name):
            return f"secrets[{i}]", f"{name!r} {problem[0]}", problem[1]
        if name in env:
            return f"secrets[{i}]", f"{name} is also in env, with its value written out", f"remove env.{name}"
    return None


def _chosen_gpus_problem(p: ClusterProfile):
    """GPUs chosen by index need GPUs, and own CUDA_VISIBLE_DEVICES."""
    chosen = [(f"{part}[{i}].gpus", h) for part, hosts in (("hosts", p.hosts), ("spares", p.spares))
              for i, h in enumerate(hosts) if isinstance(h.gpus, tuple)]
    if chosen and p.device == "cpu":
        return chosen[0][0], "names GPUs but device is cpu", "give the host's nproc instead, or drop device: cpu"
    if chosen and "CUDA_VISIBLE_DEVICES" in p.env:
        return ("env.CUDA_VISIBLE_DEVICES", f"is set, and {chosen[0][0]} chooses the GPUs too",
                "choose them in hosts[].gpus only")
    return None


def _profile_rules(p: ClusterProfile):
    if not schema.NAME_PATTERN.match(p.name):
        return "name", f"{p.name!r} cannot be used in a run id", "use letters, digits, '.', '_' and '-'"
    names = [h.host for h in p.hosts]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        return "hosts", f"{dup!r} is listed twice", "list every node once"
    spares = [h.host for h in p.spares]
    if len(set(spares)) != len(spares) or set(spares) & set(names):
        dup = next(n for n in spares if spares.count(n) > 1 or n in names)
        return "spares", f"{dup!r} is listed twice (a host is either a node or a spare)", "list every host once"
    if p.rendezvous.host is not None and p.hosts and p.rendezvous.host not in names:
        return "rendezvous.host", f"{p.rendezvous.host!r} is not one of hosts", "name one of: " + ", ".join(names)
    if isinstance(p.nproc_per_node, int) and p.nproc_per_node < 1:
        return "nproc_per_node", f"{p.nproc_per_node} is not positive", "give 1 or more, or auto"
    if p.nproc_per_node == "auto" and p.device == "cpu" and not (p.hosts and all(h.nproc for h in p.hosts)):
        return ("nproc_per_node", "auto counts GPUs but device is cpu",
                "give the number of processes per node, e.g. nproc_per_node: 2")
    if problem := _chosen_gpus_problem(p):
        return problem
    for i, line in enumerate(p.setup):
        if "\n" in line or "\0" in line:
            return f"setup[{i}]", "contains a newline or NUL", "write one command per list item"
    if p.python is not None and (not p.python.strip() or any(c in p.python for c in "\n\0")):
        return "python", f"{p.python!r} is not an interpreter path", "give e.g. /opt/venv/bin/python"
    if p.environment is not None and p.container is not None:
        return ("environment", "beside container: an image holds its own environment",
                "drop one (build the image from your lock, or drop container:)")
    if problem := _secrets_problem(p.secrets, p.env):
        return problem
    if not 3 <= p.node_timeout <= 86400:
        return "node_timeout", f"{p.node_timeout} is outside 3-86400", "give seconds, e.g. 30"
    if p.hang_timeout is not None and p.hang_timeout != 0 and not 5 <= p.hang_timeout <= 604800:
        return "hang_timeout", f"{p.hang_timeout} is outside 5-604800", "give seconds, e.g. 600 (0 or unset: off)"
    if p.on_hang not in ("stop", "keep"):
        return "on_hang", f"{p.on_hang!r} is not stop or keep", "give on_hang: stop (end the run) or keep"
    if not 1 <= p.stop_grace <= 86400:
        return "stop_grace", f"{p.stop_grace} is outside 1-86400", "give seconds to save and exit, e.g. 120"
    if not 0 <= p.max_restarts <= 100:
        return "max_restarts", f"{p.max_restarts} is outside 0-100", "give how many restarts to allow, e.g. 3"
    if p.gpu_memory is not None and not schema.SIZE_PATTERN.match(p.gpu_memory.strip()):
        return "gpu_memory", f"{p.gpu_memory!r} is not a size", "write e.g. 80GiB or 81559MiB"
    if not p.workdir or not schema.WORKDIR_PATTERN.match(p.workdir):
        return ("workdir", f"{p.workdir!r} is not a usable directory path",
                "give e.g. ~/fsdpctl or /scratch/me/fsdpctl (no spaces, quotes or shell characters)")
    return None


def _job_rules(job: schema.JobSpec):
    if not schema.NAME_PATTERN.match(job.name):
        return "name", f"{job.name!r} is not a job name", "use letters, digits, '.', '_' and '-'"
    if not job.command or not job.command[0]:
        return "command", "is empty", "give your program and its arguments, e.g. [train.py, --epochs, \"3\"]"
    if job.code is None and job.chdir is None:
        return "chdir", "code is null, so the ranks need a folder to start in", "give chdir, or a code folder"
    for name in ("code_limit_mb", "nproc_per_node", "nodes"):
        value = getattr(job, name)
        if value is not None and value < 1:
            return name, f"{value} is not positive", "give 1 or more"
    if job.spares is not None and job.spares < 0:
        return "spares", f"{job.spares} is negative", "give 0 or more spare nodes"
    if problem := _secrets_problem(job.secrets, job.env):
        return problem
    if job.container is not None and not schema.ContainerSpec.image_ok(job.container):
        return "container", f"{job.container!r} is not an image name", "give e.g. nvcr.io/nvidia/pytorch:25.01-py3"
    if job.time is not None and not schema.SLURM_TIME_PATTERN.match(job.time):
        return "time", f"{job.time!r} is not a Slurm time limit", "write e.g. \"02:00:00\""
    for i, path in enumerate(job.fetch):
        if path.startswith(("/", "~")) or ".." in path.split("/"):
            return f"fetch[{i}]", f"{path!r} is not a path inside the run directory", "write e.g. outputs/model.pt"
    return None


def _elastic_rules(elastic: schema.ElasticSpec):
    if elastic.min_nodes < 1:
        return "min_nodes", f"{elastic.min_nodes} is not positive", "give the fewest nodes a run may go on with, e.g. 2"
    return None


def _restart_rules(restart: schema.RestartSpec):
    if len(set(restart.causes)) != len(restart.causes):
        return "causes", "names a cause twice", "name each cause once"
    for i, code in enumerate(restart.exit_codes):
        if not 1 <= code <= 255:
            return f"exit_codes[{i}]", f"{code} is outside 1-255", "give a process's exit code, e.g. 75"
    if restart.per_hour is not None and not 1 <= restart.per_hour <= 1000:
        return "per_hour", f"{restart.per_hour} is outside 1-1000", "give restarts per hour, e.g. 3 (unset: no limit)"
    return None


def _notify_rules(notify: schema.NotifySpec):
    for i, url in enumerate(notify.urls):
        scheme, sep, rest = url.partition("://")
        if not sep or not scheme.isalnum() or not rest or any(c.isspace() for c in url):
            return f"urls[{i}]", f"{url!r} is not an apprise URL", "give e.g. json://host:8080/hook or ntfy://ntfy.sh/topic"
    for i, name in enumerate(notify.secrets):
        if problem := schema.env_name_problem(name):
            return f"secrets[{i}]", f"{name!r} {problem[0]}", problem[1]
    if notify.command and not notify.command[0].strip():
        return "command[0]", "is empty", "name the program, e.g. [/usr/local/bin/page-oncall]"
    if len(set(notify.events)) != len(notify.events):
        return "events", "names an event twice", "name each event once"
    if not 1 <= notify.timeout <= 300:
        return "timeout", f"{notify.timeout} is outside 1-300", "give the seconds one try may take, e.g. 10"
    if not (notify.urls or notify.secrets or notify.command):
        return "urls", "no target: no urls, secrets or command", "add urls: [json://host:8080/hook] (or secrets)"
    return None


_TORCH_BACKEND = re.compile(r"^(auto|none|cpu|xpu|cu\d{3}|rocm\d+(\.\d+)*)$")


def _environment_rules(environment: schema.EnvironmentSpec):
    if not (environment.file or environment.packages):
        return "file", "names neither file nor packages", "give file: uv.lock (or requirements.txt), or packages: [...]"
    backend = environment.torch_backend
    if not _TORCH_BACKEND.match(backend):
        return "torch_backend", f"{backend!r} is not a build of torch", "give auto, none, cpu, or e.g. cu128"
    if not 1 <= environment.keep <= 100:
        return "keep", f"{environment.keep} is outside 1-100", "give how many environments a node keeps, e.g. 3"
    return None


def _elastic_fits(p: ClusterProfile):
    """``elastic`` against the nodes the profile names (a backend's own rules check its own count)."""
    from ..backends.registry import backend_class

    elastic = p.elastic
    if elastic is None or not backend_class(p.backend).takes_spares:
        return None
    if elastic.min_nodes > len(p.hosts):
        return ("elastic.min_nodes", f"{elastic.min_nodes} is more than the profile's {len(p.hosts)} hosts",
                f"give {len(p.hosts)} or fewer")
    if p.max_restarts < 1:
        return ("elastic", "a run goes on with fewer nodes by a restart, and max_restarts is 0",
                "set max_restarts: 3 (or more) beside elastic:")
    return None


def _backend_rules(p: ClusterProfile):
    """The backend is a plugin: whether it exists, and what it needs of a profile, is its own to say."""
    from ..backends.registry import ENTRY_POINT_GROUP, backend_class, backend_names

    known = backend_names()
    if p.backend not in known:
        return ("backend", f"{p.backend!r} is not a backend fsdpctl knows",
                f"give one of {', '.join(known)} (a backend's package registers it under the entry point group "
                f"{ENTRY_POINT_GROUP})")
    if p.spares and not backend_class(p.backend).takes_spares:
        return ("spares", f"backend {p.backend} does not run on hosts the profile names",
                "remove spares: (they serve ssh profiles)")
    return _elastic_fits(p) or backend_class(p.backend).check_profile(p)


RULES: dict[type, tuple] = {
    schema.JobSpec: (_job_rules,),
    HostSpec: (_host_rules,),
    schema.NetworkSpec: (_network_rules,),
    schema.RendezvousSpec: (_rendezvous_rules,),
    schema.HealthSpec: (_health_rules,),
    schema.TelemetrySpec: (_telemetry_rules,),
    schema.SSHSpec: (_ssh_rules,),
    schema.ContainerSpec: (_container_rules,),
    schema.SlurmSpec: (_slurm_rules,),
    schema.ElasticSpec: (_elastic_rules,),
    schema.RestartSpec: (_restart_rules,),
    schema.NotifySpec: (_notify_rules,),
    schema.EnvironmentSpec: (_environment_rules,),
    ClusterProfile: (_profile_rules, _backend_rules),
}
