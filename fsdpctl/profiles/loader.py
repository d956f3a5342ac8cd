"""Load cluster profiles from YAML, strictly, and find them by name.

Every problem becomes one ``ProfileError``: ``file:line: field: what is wrong; fix``. The loader
walks YAML *nodes* (not constructed Python objects) so every value still knows its line, and it
reads typed fields from the dataclasses in ``profile_schema``. The only yaml importer.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from ..errors import ProfileError, ProfileNotFound
from ..resources import shipped_dir
from ..workload import config as train_config
from . import schema
from .rules import RULES
from .schema import ClusterProfile, HostSpec

_CONSTRUCTOR = yaml.constructor.SafeConstructor()
# Names people carry over from other tools' configs, mapped to ours for the did-you-mean hint.
_ALIASES = {
    "ifname": "interface", "iface": "interface", "nic": "interface", "socket_ifname": "interface",
    "infiniband": "ib", "hca": "ib_hca", "master": "host", "master_addr": "host",
    "master_port": "port", "nproc": "nproc_per_node", "gpus_per_node": "nproc_per_node",
    "venv": "setup", "interpreter": "python", "environment": "env", "key": "identity_file",
    "identity": "identity_file", "jump": "proxy_jump", "timeout": "connect_timeout",
}


@dataclass(frozen=True)
class LoadedProfile:
    """A validated profile, where it came from, and its text as read (a run keeps a copy)."""

    profile: ClusterProfile
    path: Path
    text: str

    @property
    def name(self) -> str:
        return self.profile.name


class _Reader:
    """Converts YAML nodes into schema types, raising ProfileError with the node's line."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, node: yaml.Node | None, field: str, problem: str, fix: str) -> typing.NoReturn:
        line = node.start_mark.line + 1 if node is not None else None
        raise ProfileError(self.source, line, field or "(top level)", problem, fix)

    # --- scalars -----------------------------------------------------------------------------
    def scalar(self, node: yaml.Node, field: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            kind = "a list" if isinstance(node, yaml.SequenceNode) else "a mapping"
            self.fail(node, field, f"is {kind}, expected a single value", "write a plain value")
        try:
            return _CONSTRUCTOR.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.fail(node, field, f"cannot be read ({_first_line(exc)})", "quote the value")

    def read_str(self, node: yaml.Node, field: str) -> str:
        value = self.scalar(node, field)
        if isinstance(value, str):
            return value
        if isinstance(value, bool) or value is None:
            self.fail(node, field, f"{node.value!r} is read as {_yaml_kind(value)}, not text",
                      f"quote it: {field.rsplit('.', 1)[-1]}: \"{node.value}\"")
        # Numbers, dates and YAML 1.1 sexagesimals (1:30:00) are taken as the text written.
        return str(node.value)

    def read_int(self, node: yaml.Node, field: str) -> int:
        value = self.scalar(node, field)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(node, field, f"{node.value!r} is not an integer", "give a whole number, e.g. 2")
        return value

    def read_float(self, node: yaml.Node, field: str) -> float:
        value = self.scalar(node, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(node, field, f"{node.value!r} is not a number", "give a number, e.g. 10")
        return float(value)

    def read_bool(self, node: yaml.Node, field: str) -> bool:
        value = self.scalar(node, field)
        if not isinstance(value, bool):
            self.fail(node, field, f"{node.value!r} is not true or false", "write true or false")
        return value

    # --- generic -----------------------------------------------------------------------------
    def read(self, node: yaml.Node, annotation: Any, field: str) -> Any:
        origin, args = get_origin(annotation), get_args(annotation)
        if origin is Union:
            options = [a for a in args if a is not type(None)]
            if type(None) in args and isinstance(node, yaml.ScalarNode) and self.scalar(node, field) is None:
                return None
            if len(options) == 1:
                return self.read(node, options[0], field)
            return self.read_union(node, options, field)
        if origin is Literal:
            return self.read_literal(node, args, field)
        if origin is tuple:
            return tuple(self.read(item, args[0], f"{field}[{i}]")
                         for i, item in enumerate(self.sequence(node, field)))
        if origin is dict:
            return self.read_env(node, field) if args[1] is str else self.read_train(node, field)
        if dataclasses.is_dataclass(annotation):
            return self.read_dataclass(node, annotation, field)
        reader = {str: self.read_str, int: self.read_int, float: self.read_float, bool: self.read_bool}
        return reader[annotation](node, field)

    def read_union(self, node: yaml.Node, options: list[Any], field: str) -> Any:
        listed = next((o for o in options if get_origin(o) is tuple), None)
        if listed is not None and isinstance(node, yaml.SequenceNode):
            return self.read(node, listed, field)
        value = self.scalar(node, field)
        for option in options:
            if get_origin(option) is Literal and value in get_args(option) and isinstance(value, str):
                return value
            if option is int and isinstance(value, int) and not isinstance(value, bool):
                return value
        wanted = " or ".join(_describe(o) for o in options)
        self.fail(node, field, f"{node.value!r} is not {wanted}", f"give {wanted}")

    def read_literal(self, node: yaml.Node, choices: tuple, field: str) -> Any:
        value = self.scalar(node, field)
        if value in choices and type(value) in (type(c) for c in choices):
            return value
        wanted = ", ".join(str(c) for c in choices)
        close = difflib.get_close_matches(str(node.value), [str(c) for c in choices], n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"use one of {wanted}"
        self.fail(node, field, f"{node.value!r} is not one of {wanted}", hint)

    def sequence(self, node: yaml.Node, field: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, field, "expected a list", f"write it as a YAML list: {field}: [a, b]")
        return node.value

    def mapping(self, node: yaml.Node, field: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """The mapping's (key, key node, value node) triples; rejects duplicate and non-text keys."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, field, "expected a mapping of names to values", "write `name: value` lines")
        seen: dict[str, int] = {}
        items = []
        for key_node, value_node in node.value:
            key = self.scalar(key_node, field or "(key)")
            path = f"{field}.{key}" if field else str(key)
            if not isinstance(key, str):
                self.fail(key_node, path, f"key {key_node.value!r} is not text", "quote the key")
            if key in seen:
                self.fail(key_node, path, f"given twice (first on line {seen[key]})", "keep one of them")
            seen[key] = key_node.start_mark.line + 1
            items.append((key, key_node, value_node))
        return items

    def read_dataclass(self, node: yaml.Node, cls: type, field: str) -> Any:
        if cls is HostSpec and isinstance(node, yaml.ScalarNode):
            return self.check(node, field, HostSpec(host=self.read_str(node, field)))
        hints = typing.get_type_hints(cls)
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, key_node, value_node in self.mapping(node, field):
            path = f"{field}.{key}" if field else key
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                if not close and _ALIASES.get(key) in known:
                    close = [_ALIASES[key]]
                fix = f"did you mean '{close[0]}'?" if close else "valid keys: " + ", ".join(known)
                self.fail(key_node, path, "unknown key", fix)
            values[key] = self.read(value_node, hints[key], path)
        for name, spec in known.items():
            missing = spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
            if missing and name not in values:
                self.fail(node, f"{field}.{name}" if field else name, "is required",
                          f"add `{name}:` to {field or 'the profile'}")
        return self.check(node, field, cls(**values))

    def read_env(self, node: yaml.Node, field: str) -> dict[str, str]:
        env = {}
        for key, key_node, value_node in self.mapping(node, field):
            path = f"{field}.{key}"
            if problem := schema.env_name_problem(key):
                self.fail(key_node, path, *problem)
            value = self.scalar(value_node, path)
            if isinstance(value, bool) or value is None:
                self.fail(value_node, path, f"{value_node.value!r} is read as {_yaml_kind(value)}",
                          f"quote it: {key}: \"{value_node.value}\"")
            text = value if isinstance(value, str) else str(value_node.value)
            if "\n" in text or "\0" in text:
                self.fail(value_node, path, "contains a newline or NUL", "put it on one line")
            env[key] = text
        return env

    def read_train(self, node: yaml.Node, field: str) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        for key, key_node, value_node in self.mapping(node, field):
            name = key.replace("-", "_")
            try:
                settings[name] = train_config.coerce_value(name, self.scalar(value_node, f"{field}.{key}"))
            except train_config.ConfigError as exc:
                self.fail(key_node if exc.problem == "unknown setting" else value_node,
                          f"{field}.{key}", exc.problem, exc.fix)
        try:
            train_config.check_ranges(settings)
        except train_config.ConfigError as exc:
            self.fail(node, f"{field}.{exc.name}", exc.problem, exc.fix)
        return settings

    # --- per-type rules ----------------------------------------------------------------------
    def check(self, node: yaml.Node, field: str, value: Any) -> Any:
        """Range and safety rules of one section, reported at the section's line."""
        rules = RULES.get(type(value), ())
        for rule in rules:
            problem = rule(value)
            if problem:
                sub, what, fix = problem
                self.fail(self.locate(node, sub), f"{field}.{sub}" if field else sub, what, fix)
        return value

    def locate(self, node: yaml.Node, key: str) -> yaml.Node:
        """The value node of a dotted ``key`` inside a mapping node, for precise line numbers."""
        head, _, rest = key.partition(".")
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == head.split("[")[0]:
                    return self.locate(value_node, rest) if rest else value_node
        return node


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _yaml_kind(value: Any) -> str:
    return "null" if value is None else ("a boolean" if isinstance(value, bool) else type(value).__name__)


def _describe(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return " or ".join(repr(c) for c in get_args(annotation))
    return {int: "an integer", float: "a number", str: "text", bool: "true or false"}.get(annotation, "a value")


def parse_profile(text: str, source: str) -> ClusterProfile:
    """Validate one profile document. ``source`` names it in errors (usually its path)."""
    return parse_document(text, source, ClusterProfile, "profile")


def parse_document(text: str, source: str, cls: type, what: str) -> Any:
    """One YAML document read strictly into the dataclass ``cls`` (a profile, a job file)."""
    reader = _Reader(source)
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise ProfileError(source, line, "(yaml)", exc.problem or "malformed YAML",
                           "fix the YAML syntax at that line") from None
    except yaml.YAMLError as exc:
        raise ProfileError(source, None, "(yaml)", _first_line(exc), "fix the YAML syntax") from None
    if not documents or documents[0] is None:
        raise ProfileError(source, None, "(top level)", "the file is empty", f"write a {what}: at least `name:`")
    if len(documents) > 1:
        raise ProfileError(source, documents[1].start_mark.line + 1, "(top level)",
                           "holds more than one YAML document", f"keep one {what} per file")
    return reader.read(documents[0], cls, "")


def load_profile_file(path: Path) -> LoadedProfile:
    """Read and validate the profile at ``path``."""
    shown = display_path(path)
    text = read_text(path, "profile", "run `fsdpctl profiles`")
    return LoadedProfile(parse_profile(text, shown), path, text)


def read_text(path: Path, what: str, where: str) -> str:
    """A YAML file's text; one-line errors for a missing, unreadable or non-UTF-8 file."""
    shown = display_path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ProfileNotFound(f"{shown}: no such {what} file", f"check the path, or {where}") from None
    except OSError as exc:
        raise ProfileNotFound(f"{shown}: cannot be read ({exc.strerror})", "check its permissions") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(shown, None, "(file)", f"is not UTF-8 text (byte {exc.start})",
                           f"save the {what} as UTF-8") from None


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def profile_search_path(cwd: Path | None = None, env: dict[str, str] | None = None) -> list[tuple[str, Path]]:
    """Where ``--profile NAME`` looks, in order: (origin label, folder)."""
    env = os.environ if env is None else env
    cwd = Path.cwd() if cwd is None else cwd
    config_home = Path(env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config")
    folders = [
        ("project", cwd / "cluster_profiles"),
        ("user", config_home / "fsdpctl" / "profiles"),
        ("shipped", shipped_dir("cluster_profiles")),
    ]
    # In a source checkout the project folder is the shipped one: list it once.
    unique: list[tuple[str, Path]] = []
    for origin, folder in folders:
        if all(_same_dir(folder, seen) is False for _, seen in unique):
            unique.append((origin, folder))
    return unique


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def looks_like_path(name: str) -> bool:
    """A ``--profile`` value naming a file rather than a profile in the search path."""
    return name.endswith((".yaml", ".yml")) or os.sep in name or "/" in name


def find_profile(name: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Path:
    """Resolve ``--profile`` to a file: a path as given, else the first NAME.yaml in the search path."""
    if looks_like_path(name):
        return Path(name).expanduser()
    if not schema.NAME_PATTERN.match(name):
        raise ProfileNotFound(f"--profile {name!r}: not a profile name",
                              "give a name from `fsdpctl profiles` or a path to a .yaml file")
    for _, folder in profile_search_path(cwd, env):
        for suffix in (".yaml", ".yml"):
            candidate = folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    known = sorted({entry.name for entry in list_profiles(cwd, env)})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{close[0]}'?" if close else "known profiles: " + (", ".join(known) or "none")
    raise ProfileNotFound(f"--profile {name}: no such profile", hint)


def load_profile(name: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> LoadedProfile:
    """``--profile`` value -> validated profile (see ``find_profile`` for the search order)."""
    return load_profile_file(find_profile(name, cwd, env))


@dataclass(frozen=True)
class ProfileEntry:
    """One profile file found in the search path; ``shadowed`` when an earlier folder has the name."""

    name: str
    path: Path
    origin: str
    shadowed: bool


def list_profiles(cwd: Path | None = None, env: dict[str, str] | None = None) -> list[ProfileEntry]:
    """Every profile file in the search path, in search order."""
    entries: list[ProfileEntry] = []
    seen: set[str] = set()
    for origin, folder in profile_search_path(cwd, env):
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix in (".yaml", ".yml") and path.is_file():
                entries.append(ProfileEntry(path.stem, path, origin, path.stem in seen))
                seen.add(path.stem)
    return entries
