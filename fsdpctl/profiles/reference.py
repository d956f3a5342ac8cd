"""The profile reference in Markdown, generated from the schema's field docstrings.

``fsdpctl profiles --reference`` prints it; ``docs/profiles.md`` is this output (a test keeps
them equal), so the documentation cannot drift from what the loader accepts.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Literal, Union, get_args, get_origin

from ..workload import config as train_config
from . import schema

SECTIONS: list[tuple[str, type]] = [
    ("", schema.ClusterProfile),
    ("hosts[]", schema.HostSpec),
    ("network", schema.NetworkSpec),
    ("rendezvous", schema.RendezvousSpec),
    ("health", schema.HealthSpec),
    ("telemetry", schema.TelemetrySpec),
    ("container", schema.ContainerSpec),
    ("environment", schema.EnvironmentSpec),
    ("ssh", schema.SSHSpec),
    ("slurm", schema.SlurmSpec),
    ("elastic", schema.ElasticSpec),
    ("restart", schema.RestartSpec),
    ("export", schema.ExportSpec),
    ("export.wandb", schema.WandbSpec),
    ("export.mlflow", schema.MlflowSpec),
    ("notify", schema.NotifySpec),
]
JOB_SECTION = ("job files", schema.JobSpec)


def _type_text(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Union:
        parts = [_type_text(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" (optional)" if type(None) in args else "")
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is tuple:
        return f"list of {_type_text(args[0])}"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(annotation):
        return "section"
    return {str: "text", int: "integer", float: "number", bool: "true/false"}.get(annotation, str(annotation))


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return "—" if f.default is None else f"`{f.default}`" if f.default != () else "`[]`"
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "`{}`" if value == {} else "(section defaults)"
    return "**required**"


def reference_markdown() -> str:
    """The whole profile reference: one table per section, then the workload settings."""
    out = ["# Cluster profile reference", "",
           "Generated from `fsdpctl/profiles/schema.py` (`fsdpctl profiles --reference`). Unknown keys, wrong",
           "types and unsafe values are refused with `file:line: field: problem; fix`.", ""]
    for prefix, cls in [*SECTIONS, JOB_SECTION]:
        docs = train_config.field_docs(cls)
        hints = typing.get_type_hints(cls)
        title = "Job files (`jobs/NAME.yaml`, `--job`)" if cls is schema.JobSpec else \
            f"`{prefix}`" if prefix else "Top level"
        prefix = "" if cls is schema.JobSpec else prefix
        out += [f"## {title}", "", inspect.cleandoc(cls.__doc__ or ""), "",
                "| field | type | default | meaning |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            name = f"{prefix}.{f.name}" if prefix else f.name
            meaning = " ".join(docs.get(f.name, "").split()).replace("|", "\\|")
            out.append(f"| `{name}` | {_type_text(hints[f.name])} | {_default_text(f)} | {meaning} |")
        out.append("")
    out += ["## `train`", "",
            "Defaults for the bundled workload; any setting of `python -m fsdpctl.workload.train` (flags",
            "`--name-with-dashes`). Command-line flags of `launch`/`submit` (and `--set NAME=VALUE`) override them.",
            "", "| setting | accepts | default | meaning |", "|---|---|---|---|"]
    for name, f in train_config.CONFIG_FIELDS.items():
        meaning = " ".join(train_config.FIELD_DOCS.get(name, "").split()).replace("|", "\\|")
        accepts = train_config.describe_type(name).replace("|", "\\|")
        default = "—" if f.default is None else f"`{f.default}`"
        out.append(f"| `train.{name}` | {accepts} | {default} | {meaning} |")
    out.append("")
    return "\n".join(out)
