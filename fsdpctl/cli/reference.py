"""The command-line reference, written from the Typer application itself: every command, its help,
and every option and argument with its default, so ``docs/reference/cli.md`` cannot drift from
the code (a test compares the two).

    python -m fsdpctl.cli.reference > docs/reference/cli.md
    python -m fsdpctl.cli.reference api > docs/reference/api.md   (the Python API's, from fsdpctl.api.reference)
"""

from __future__ import annotations

import inspect
from typing import Any

import typer

INTRO = ("# Command-line reference\n\nGenerated from the `fsdpctl` application itself "
         "(`python -m fsdpctl.cli.reference > docs/reference/cli.md`); a test fails when it is stale.\n")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: Any) -> str:
    default = getattr(param, "default", None)
    if getattr(param, "is_flag", False) and not getattr(param, "secondary_opts", None):
        return "off" if not default else "on"
    if default is None or default == () or default == []:
        return "—"
    if callable(default):
        return "—"
    return f"`{default}`"


def _names(param: Any) -> str:
    if isinstance(param, typer.core.TyperArgument):
        return f"`{param.metavar or param.name.upper()}` (argument)"
    names = [*param.opts, *param.secondary_opts]
    metavar = getattr(param, "metavar", None)
    shown = ", ".join(f"`{name}`" for name in names)
    return f"{shown} `{metavar}`" if metavar and not getattr(param, "is_flag", False) else shown


def command_markdown(name: str, command: Any) -> str:
    """One command's section."""
    lines = [f"## `fsdpctl {name}`", "", inspect.cleandoc(command.help or "").strip(), ""]
    params = [p for p in command.params if not getattr(p, "hidden", False) and p.name != "help"]
    if params:
        lines += ["| option | default | what it does |", "|---|---|---|"]
        lines += [f"| {_names(p)} | {_default(p)} | {_cell(getattr(p, 'help', None) or '')} |" for p in params]
        lines.append("")
    return "\n".join(lines)


def first_sentence(text: str) -> str:
    """A command's help up to its first full stop (its one-line summary)."""
    flat = _cell(inspect.cleandoc(text))
    end = flat.find(". ")
    return flat if end < 0 else flat[:end + 1]


def commands() -> dict[str, Any]:
    """The application's commands, in the order ``fsdpctl --help`` lists them."""
    from .app import app

    return dict(typer.main.get_command(app).commands)


def reference_markdown() -> str:
    """The whole reference, as ``docs/reference/cli.md`` holds it."""
    listed = commands()
    index = ["| command | what it does |", "|---|---|"]
    index += [f"| [`{name}`](#fsdpctl-{name}) | {first_sentence(cmd.help or '')} |" for name, cmd in listed.items()]
    return "\n".join([INTRO, *index, "", *(command_markdown(n, c) for n, c in listed.items())]).rstrip() + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["api"]:
        from ..api.reference import reference_markdown as api_reference

        typer.echo(api_reference(), nl=False)
    else:
        typer.echo(reference_markdown(), nl=False)
