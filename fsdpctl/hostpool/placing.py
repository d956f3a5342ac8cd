"""The hosts a launch of a profile uses: its remembered exclusions and ``--exclude`` applied, a spare
in each excluded host's place, a one-line refusal when the spares do not go round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from ..profiles.schema import ClusterProfile
    from .choice import HostChoice


def excluded_hosts(profile: ClusterProfile, exclude: Sequence[str] = ()) -> dict[str, str]:
    """The hosts no run of ``profile`` may use now, with why: those remembered as excluded, and
    ``exclude`` (``launch --exclude``). An unknown host, or hosts on a backend without spares, is refused."""
    from ..backends.registry import backend_class
    from .store import read_exclusions

    names = [h.host for h in (*profile.hosts, *profile.spares)]
    for host in exclude:
        if host not in names:
            raise UsageError(f"--exclude {host}: not a host of profile {profile.name}",
                             f"name one of: {', '.join(names) or '(it has none)'}")
    if not backend_class(profile.backend).takes_spares:
        if exclude:
            raise UsageError(f"--exclude: backend {profile.backend} does not run on hosts the profile names",
                             "drop --exclude")
        return {}
    remembered = read_exclusions(profile.name)
    excluded = {host: f"{e.reason} (excluded {e.since}" + (f" by run {e.run_id})" if e.run_id else ")")
                for host, e in remembered.items() if host in names}
    excluded.update({host: "--exclude" for host in exclude})
    return excluded


def place_hosts(profile: ClusterProfile, exclude: Sequence[str] = (), min_nodes: int = 0) -> HostChoice:
    """The hosts a run of ``profile`` uses: a spare in the place of each excluded host (remembered,
    or ``exclude``). UsageError, saying how many hosts are missing, when the spares do not go round
    and fewer than ``min_nodes`` (an elastic run's; 0: every one) are left."""
    from .choice import choose_hosts

    excluded = excluded_hosts(profile, exclude)
    choice = choose_hosts(profile, excluded)
    if choice.missing and not (min_nodes and len(choice.hosts) >= min_nodes):
        below = f"; fewer than min_nodes {min_nodes} left" if min_nodes else ""
        raise UsageError(f"profile {profile.name}: {choice.shortage(excluded)}{below}",
                         f"add spares: to the profile, or put a host back once it is healthy "
                         f"(`fsdpctl hosts -p {profile.name} --restore HOST`)")
    return choice
