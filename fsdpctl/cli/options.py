"""The options launch, submit and render share, declared once: the ``with_options`` decorator adds
them to a command's signature and hands the command one ``Flags`` value, which turns into the API's
``JobOptions``."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer

from ..errors import UsageError
from .complete import profile_completion, run_completion

PROFILE_HELP = "Profile name (./cluster_profiles, ~/.config/fsdpctl/profiles, shipped) or a .yaml path."
ProfileOpt = typer.Option(..., "--profile", "-p", help=PROFILE_HELP, autocompletion=profile_completion)

JOB = {
    "command": (Optional[list[str]], typer.Argument(
        None, help="Your program and its arguments, after --: SCRIPT.py ARGS... or -m MODULE ARGS...; without one, "
                   "the bundled workload runs.", show_default=False, metavar="-- COMMAND")),
    "profile": (Optional[str], typer.Option(None, "--profile", "-p", help=PROFILE_HELP + " May come from --job.",
                                            autocompletion=profile_completion)),
    "job": (Optional[str], typer.Option(None, "--job", help="A job file (./jobs/NAME.yaml or a path): command, code, "
                                        "env, requirements and defaults; flags win over it.")),
    "code": (Optional[Path], typer.Option(None, "--code", help="Folder copied to every node for your program "
                                          "(default: the current folder); git work trees copy what git would.")),
    "no_code": (bool, typer.Option(False, "--no-code", help="Copy no code: the ranks start in --chdir (default: this "
                                   "folder's path), which every node already has on shared storage.")),
    "chdir": (Optional[str], typer.Option(None, "--chdir", help="With --no-code: the folder the ranks start in on "
                                          "the nodes.")),
    "code_limit": (Optional[int], typer.Option(None, "--code-limit", help="Refuse to copy more than this many MB of "
                                               "code (default 100).")),
    "env": (Optional[list[str]], typer.Option(None, "--env", help="NAME=VALUE for every rank, after the profile's env "
                                              "(repeatable); a bare NAME passes that variable of this environment "
                                              "as a secret.")),
    "requirements": (Optional[Path], typer.Option(None, "--requirements", help="A requirements.txt every node must "
                                                  "meet, with the same versions on every node (checked by the "
                                                  "preflight).")),
    "env_from": (Optional[Path], typer.Option(None, "--env-from", metavar="FILE", help="A uv.lock, pyproject.toml or "
                                              "requirements.txt: fsdpctl makes that environment on every node (cached "
                                              "there) and runs the ranks in it (over the profile's "
                                              "environment.file).")),
}
# The workload settings worth a flag of their own; every other one goes through --set or the profile.
WORKLOAD = {
    "fsdp": (Optional[int], typer.Option(None, "--fsdp", help="FSDP version: 1 or 2.")),
    "preset": (Optional[str], typer.Option(None, "--preset", help="Model preset: tiny, small, gpt2-124m.")),
    "steps": (Optional[int], typer.Option(None, "--steps", help="Optimizer steps to train.")),
    "epochs": (Optional[int], typer.Option(None, "--epochs", help="Epochs to train (instead of --steps).")),
    "batch_size": (Optional[int], typer.Option(None, "--batch-size", help="Sequences per rank per micro-step.")),
    "sharding": (Optional[str], typer.Option(None, "--sharding", help="full, grad-op, no-shard or hybrid.")),
    "mixed_precision": (Optional[str], typer.Option(None, "--mixed-precision", help="auto, bf16, fp16 or fp32.")),
    "settings": (Optional[list[str]], typer.Option(None, "--set", help="Any workload setting as NAME=VALUE "
                                                   "(repeatable), e.g. --set lr=1e-3.")),
}
CLUSTER = {
    "nproc_per_node": (Optional[int], typer.Option(None, "--nproc-per-node", help="Processes per node (overrides the "
                                                   "profile).")),
    "master_port": (Optional[int], typer.Option(None, "--master-port", help="Rendezvous port on the master "
                                                "(overrides the profile).")),
    "debug": (bool, typer.Option(False, "--debug", help="Add NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=ALL, "
                                 "TORCH_DISTRIBUTED_DEBUG=DETAIL.")),
    "container": (Optional[str], typer.Option(None, "--container", metavar="IMAGE", help="Run the ranks inside "
                                              "this image on every node (over the profile's container.image; "
                                              "runtime and mounts from its container section).")),
}
RUN = {
    "model": (Optional[str], typer.Option(None, "--model", metavar="MODULE:FACTORY",
                                          help="Your program's model, for the memory check before it starts (as "
                                               "`fsdpctl estimate --model`; the bundled workload needs none).")),
    "wrap": (Optional[str], typer.Option(None, "--wrap", metavar="CLASS", help="With --model: the class FSDP shards.")),
    "input_shape": (Optional[str], typer.Option(None, "--input-shape", metavar="B,S,...",
                                                help="With --model: its input's shape, B for the batch.")),
    "dry_run": (bool, typer.Option(False, "--dry-run", help="Print the plan and every rendered script; touch "
                                   "nothing.")),
    "as_json": (bool, typer.Option(False, "--json", help="With --dry-run: print the plan and scripts as JSON.")),
    "hang_timeout": (Optional[int], typer.Option(
        None, "--hang-timeout", metavar="SECONDS",
        help="Hang watchdog: after this long without progress (no new line from any rank; for the bundled workload, "
             "no new step) every rank's stack and the flight-recorder dumps go to runs/<id>/hang/, the odd rank is "
             "named, and the run ends with exit 124 (see --on-hang). 0: off. Default: the profile's hang_timeout.")),
    "on_hang": (Optional[str], typer.Option(None, "--on-hang", metavar="stop|keep",
                                            help="What a hang does: stop (end the run, exit 124) or keep (report and "
                                                 "let it run). Default: the profile's on_hang, stop.")),
    "tensorboard": (Optional[str], typer.Option(None, "--tensorboard", metavar="DIR",
                                                help="Write TensorBoard event files into DIR/<run_id>/ as the run goes "
                                                     "(over the profile's export.tensorboard).")),
    "prometheus": (Optional[str], typer.Option(None, "--prometheus", metavar="PATH",
                                               help="Keep a Prometheus textfile (PATH.prom, or fsdpctl_<run_id>.prom "
                                                    "in the folder PATH) for node_exporter while the run goes (over "
                                                    "the profile's export.prometheus).")),
    "telemetry": (Optional[bool], typer.Option(None, "--telemetry/--no-telemetry",
                                               help="Your program: every rank's steps, loss and times from "
                                                    "fsdpctl's start-up hook, no code of yours (default: the "
                                                    "profile's telemetry.enabled, on).")),
    "tokens_per_step": (Optional[int], typer.Option(None, "--tokens-per-step", metavar="N",
                                                    help="Your program's tokens per optimizer step over all ranks, "
                                                         "for an exact tokens/s (else estimated from its batches).")),
    "flops_per_token": (Optional[float], typer.Option(None, "--flops-per-token", metavar="F",
                                                      help="Your model's training FLOPs per token: MFU for your "
                                                           "program on GPUs whose peak fsdpctl knows.")),
    "resume": (Optional[str], typer.Option(None, "--resume", metavar="RUN_ID", autocompletion=run_completion,
                                           help="Start the next attempt of RUN_ID in its own run directory with its "
                                                "own plan (the bundled workload from its newest complete checkpoint); "
                                                "only --steps/--epochs may change.")),
}


@dataclass(frozen=True)
class Flags:
    """The shared options as given (None / False / empty: not given)."""

    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def workload(self) -> dict[str, Any]:
        """The bundled workload's settings the flags give (``--set`` items, then the named flags)."""
        from ..api.options import parse_setting

        settings: dict[str, Any] = {}
        for item in self.values.get("settings") or ():
            name, sep, text = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or not name:
                raise UsageError(f"--set {item!r}: expected NAME=VALUE", "write e.g. --set lr=0.001")
            settings[name] = parse_setting(text)
        settings.update({name: self.values[name] for name in WORKLOAD if name != "settings"
                         and self.values.get(name) is not None})
        return settings

    def job_options(self, **extra: Any):
        """The API's JobOptions for these flags (and the command's own, ``extra``)."""
        from ..job import JobOptions, parse_env_items

        env, secrets = parse_env_items(tuple(self.values.get("env") or ()))
        given = {"command": tuple(self.values.get("command") or ()), "job": self.values.get("job"),
                 "code": self.values.get("code"), "no_code": self.values.get("no_code", False),
                 "chdir": self.values.get("chdir"), "code_limit_mb": self.values.get("code_limit"), "env": env,
                 "secrets": secrets, "requirements": self.values.get("requirements"), "workload": self.workload(),
                 "env_from": self.values.get("env_from"),
                 "nproc_per_node": self.values.get("nproc_per_node"), "master_port": self.values.get("master_port"),
                 "debug": self.values.get("debug", False), "hang_timeout": self.values.get("hang_timeout"),
                 "container": self.values.get("container"), "tensorboard": self.values.get("tensorboard"),
                 "prometheus": self.values.get("prometheus"), "telemetry": self.values.get("telemetry"),
                 "tokens_per_step": self.values.get("tokens_per_step"),
                 "flops_per_token": self.values.get("flops_per_token"),
                 "on_hang": self.values.get("on_hang"), "model": self.values.get("model"),
                 "wrap": self.values.get("wrap"), "input_shape": input_shape(self.values.get("input_shape")), **extra}
        return JobOptions(**given)

    def refuse_with_resume(self, **others: Any) -> None:
        """Flags that would change the plan of the run being resumed (it keeps its own): everything
        but --steps/--epochs and the watchdog's settings, and the command's ``others``."""
        allowed = {"resume", "steps", "epochs", "hang_timeout", "on_hang"}
        given = {**{k: v for k, v in self.values.items() if k not in allowed}, **others}
        for name, value in given.items():
            if value not in (None, False, [], ()):
                flag = {"command": "-- COMMAND", "code_limit": "--code-limit", "settings": "--set",
                        "as_json": "--json"}.get(name) or "--" + name.replace("_", "-")
                raise UsageError(f"{flag}: --resume continues the run with its own plan (profile, settings, command)",
                                 "drop it (only --steps and --epochs may change), or start a new run without --resume")


def input_shape(text: Optional[str]) -> tuple[Any, ...]:
    """``B,1024,768`` as (``"B"``, 1024, 768): numbers, and B for the batch."""
    if not text:
        return ()
    try:
        return tuple("B" if part.strip() == "B" else int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"--input-shape {text!r}: not numbers and B", "write it like B,1024,768") from None


def with_options(*groups: dict[str, tuple[Any, Any]]):
    """Add the options of ``groups`` to a command, before its own; the command receives them as one
    ``flags: Flags`` argument (Typer reads the signature this sets)."""
    shared = [(name, annotation, default) for group in groups for name, (annotation, default) in group.items()]

    def decorate(func):
        own = [p for p in inspect.signature(func, eval_str=True).parameters.values() if p.name != "flags"]
        params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                    annotation=annotation) for name, annotation, default in shared]

        @functools.wraps(func)
        def command(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name, _, _ in shared}
            return func(flags=Flags(values), **kwargs)

        command.__signature__ = inspect.Signature([*params, *own])  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in (*params, *own)}
        del command.__wrapped__  # Typer must read the signature set here, not the function's own
        return command

    return decorate
