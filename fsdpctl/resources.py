"""Where the shipped templates and cluster profiles are, in a checkout and in an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def shipped_dir(kind: str) -> Path:
    """The folder of shipped ``templates`` or ``cluster_profiles``.

    A wheel carries them in ``fsdpctl/_data/``; a source checkout (editable install) keeps them
    at the top of the repository, next to the package."""
    installed = _PACKAGE_DIR / "_data" / kind
    if installed.is_dir():
        return installed
    return _PACKAGE_DIR.parent / kind
