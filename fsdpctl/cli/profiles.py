"""``fsdpctl profiles``: the cluster profiles found, and where from."""

from __future__ import annotations

import typer

from ..errors import FsdpctlError


def profiles(
    reference: bool = typer.Option(False, "--reference", help="Print every profile field, documented (Markdown)."),
) -> None:
    """List the cluster profiles in the search path, in the order --profile looks."""
    if reference:
        from ..profiles.reference import reference_markdown

        typer.echo(reference_markdown(), nl=False)
        return
    from ..backends import backend_class
    from ..profiles.loader import list_profiles, load_profile_file, profile_search_path

    entries = list_profiles()
    for origin, folder in profile_search_path():
        typer.echo(f"# {origin}: {folder}{'' if folder.is_dir() else ' (missing)'}", err=True)
    for entry in entries:
        try:
            profile = load_profile_file(entry.path).profile
            nodes, _ = backend_class(profile.backend).layout(profile)
            what = f"{profile.backend}, {nodes or '?'} node(s)"
        except FsdpctlError as exc:
            what = f"INVALID: {exc.message}"
        note = " (shadowed)" if entry.shadowed else ""
        typer.echo(f"{entry.name}\t{entry.origin}\t{entry.path}\t{what}{note}")
