"""The Python API reference, written from the objects ``import fsdpctl`` offers and their docstrings,
so ``docs/reference/api.md`` cannot drift from the code (a test compares the two, and fails on a
public name, method or property without a docstring).

    python -m fsdpctl.cli.reference api > docs/reference/api.md
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import typing
from typing import Any

INTRO = ("# Python API reference\n\nEverything `import fsdpctl` offers, with its signature and docstring, generated "
         "from the code (`python -m fsdpctl.cli.reference api > docs/reference/api.md`); a test fails when it is "
         "stale. "
         "The guide with examples: [the Python API](../guides/python-api.md).\n")


def _doc(obj: Any) -> str:
    return inspect.cleandoc(inspect.getdoc(obj) or "")


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _code(name: str, obj: Any) -> str:
    return f"```python\n{name}{_signature(obj)}\n```\n\n"


def members(cls: type) -> list[tuple[str, Any]]:
    """A class's public methods and properties, defined by fsdpctl (not inherited from Python)."""
    found = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (property, staticmethod, classmethod)) or inspect.isfunction(member):
            found.append((name, member))
    return found


ALIASES = {"Event": "What an ``on_event`` handler receives: one of the event types below, each a frozen dataclass."}
"""Public names that are type aliases (no docstring of their own can be set on them)."""


def name_markdown(name: str, obj: Any) -> str:
    """One public name's section."""
    if name in ALIASES:
        kinds = ", ".join(f"`{arg.__name__}`" for arg in typing.get_args(obj))
        return f"## `fsdpctl.{name}` (type alias)\n\n{ALIASES[name]} {kinds}.\n"
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        values = ", ".join(f"`{m.value}`" for m in obj)
        return f"## `fsdpctl.{name}`\n\nAn enumeration: {values}.\n\n{_doc(obj)}\n"
    if inspect.isclass(obj):
        kind = "exception" if issubclass(obj, BaseException) else "dataclass" if dataclasses.is_dataclass(obj) \
            else "class"
        head = f"## `fsdpctl.{name}` ({kind})\n\n{_doc(obj)}\n"
        if dataclasses.is_dataclass(obj):
            fields = ", ".join(f"`{f.name}`" for f in dataclasses.fields(obj))
            head += f"\nFields: {fields}.\n"
        parts = [head]
        for member_name, member in members(obj):
            target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if isinstance(member, property):
                parts.append(f"### `{name}.{member_name}` (property)\n\n{_doc(target)}\n")
            else:
                parts.append(f"### `{name}.{member_name}`\n\n{_code(member_name, target)}{_doc(target)}\n")
        return "\n".join(parts)
    if callable(obj):
        return f"## `fsdpctl.{name}`\n\n{_code('fsdpctl.' + name, obj)}{_doc(obj)}\n"
    return f"## `fsdpctl.{name}`\n\n{_doc(obj)}\n"


def undocumented() -> list[str]:
    """Public names, methods and properties without a docstring of their own."""
    import fsdpctl

    missing = []
    for name in fsdpctl.PUBLIC_NAMES:
        obj = getattr(fsdpctl, name)
        if name not in ALIASES and not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj) and not issubclass(obj, enum.Enum):
            for member_name, member in members(obj):
                target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if not (getattr(target, "__doc__", None) or "").strip():
                    missing.append(f"{name}.{member_name}")
    return missing


def reference_markdown() -> str:
    """The whole reference, as ``docs/reference/api.md`` holds it (names in alphabetical order)."""
    import fsdpctl

    names = sorted(fsdpctl.PUBLIC_NAMES, key=str.lower)
    return "\n".join([INTRO, *(name_markdown(n, getattr(fsdpctl, n)) for n in names)]).rstrip() + "\n"
