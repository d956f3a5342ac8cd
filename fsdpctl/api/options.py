"""The API's keyword arguments as the one options value launch and submit take (``JobOptions``, in
``fsdpctl.job``), and the bundled workload's settings checked like the profile's ``train`` section."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import UsageError
from ..job import JobOptions

__all__ = ["Command", "JobOptions", "PathLike", "build_options", "resolve_options", "workload_settings"]

PathLike = Union[str, "os.PathLike[str]"]
"""A path, as text or as a ``pathlib.Path``."""
Command = Union[str, Sequence[str]]
"""Your program and its arguments: ``["train.py", "--lr", "3e-4"]``, ``["-m", "pkg.train"]``, or one
string split as a shell would (``"train.py --lr 3e-4"``)."""


def build_options(command: Optional[Command] = None, **values: Any) -> JobOptions:
    """Options from the API's keyword arguments: those named like a JobOptions field set it, every
    other one is a setting of the bundled workload (``steps=20``); ``env`` may be a mapping or
    ``NAME=VALUE`` strings (a bare ``NAME`` is a secret)."""
    from ..job import parse_env_items

    known = {f.name for f in fields(JobOptions)} - {"command", "workload"}
    options = {name: values.pop(name) for name in list(values) if name in known}
    options = {name: value for name, value in options.items() if value is not None}
    env = options.pop("env", None) or {}
    if not isinstance(env, Mapping):
        env, named = parse_env_items(tuple(env))
        options["secrets"] = (*named, *tuple(options.get("secrets", ())))
    if "secrets" in options:
        secrets = options["secrets"]
        options["secrets"] = (secrets,) if isinstance(secrets, str) else tuple(secrets)
    if isinstance(options.get("exclude"), str):
        options["exclude"] = (options["exclude"],)
    if "exclude" in options:
        options["exclude"] = tuple(options["exclude"])
    for name in ("code", "requirements", "env_from"):
        if name in options:
            options[name] = Path(options[name]).expanduser()
    workload = dict(values.pop("workload", None) or {})
    workload.update(values)
    return JobOptions(command=command_words(command), env=dict(env), workload=workload, **options)


def resolve_options(options: Optional[JobOptions], command: Optional[Command], values: dict[str, Any]) -> JobOptions:
    """The API's keyword arguments as JobOptions, or the JobOptions given as ``options=`` (then
    nothing else may be given)."""
    if options is None:
        return build_options(command, **values)
    given = sorted(name for name, value in values.items() if value not in (None, (), False, {}))
    if command is not None or given:
        raise UsageError(f"options= and {', '.join(given) or 'command'}: both given",
                         "put everything in the JobOptions, or pass keyword arguments only")
    return options


def command_words(command: Optional[Command]) -> tuple[str, ...]:
    """A command as the words every rank receives."""
    if command is None:
        return ()
    if isinstance(command, str):
        return tuple(shlex.split(command))
    words = tuple(command)
    if not all(isinstance(word, str) for word in words):
        raise UsageError(f"command {list(words)!r}: every word must be text", "pass e.g. ['train.py', '--lr', '3e-4']")
    return words


def workload_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings of the bundled workload, each checked like the profile's ``train`` section. A
    ``steps`` given here replaces the profile's ``epochs`` (and the other way round) unless both are
    given."""
    from ..workload import config as train_config

    settings: dict[str, Any] = {}
    for raw_name, value in values.items():
        name = raw_name.strip().replace("-", "_")
        try:
            settings[name] = train_config.coerce_value(name, value)
        except train_config.ConfigError as exc:
            raise UsageError(f"{train_config.flag_name(name)}: {exc.problem}", exc.fix) from None
    if settings.get("steps") is not None and "epochs" not in settings:
        settings["epochs"] = None
    if settings.get("epochs") is not None and "steps" not in settings:
        settings["steps"] = None
    return settings


def parse_setting(text: str) -> Any:
    """A ``--set NAME=VALUE`` value, written like a YAML scalar: a number, true/false, null, or text."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        lowered = text.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        if lowered in ("none", "null"):
            return None
        return text
