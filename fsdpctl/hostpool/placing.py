"""The hosts a launch of a profile uses: its remembered exclusions and ``--exclude`` applied, a spare
in each excluded host's place, a one-line refusal when the spares do not go round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from ..profiles.schema import ClusterProfile, HostSpec
    from .choice import HostChoice


def split_exclude(profile: ClusterProfile, exclude: Sequence[str]) -> tuple[list[str], dict[str, list[int]]]:
    """``--exclude`` values as hosts, and GPUs by host (``HOST:3``, as DeepSpeed's ``--exclude`` writes
    them). A profile's host whose own name ends in ``:N`` (an IPv6 address) stays a host."""
    names = {h.host for h in (*profile.hosts, *profile.spares)}
    hosts: list[str] = []
    gpus: dict[str, list[int]] = {}
    for entry in exclude:
        host, colon, index = entry.rpartition(":")
        if entry in names or not colon or not index.isdigit() or host not in names:
            hosts.append(entry)
        else:
            gpus.setdefault(host, []).append(int(index))
    return hosts, gpus


def without_gpus(profile: ClusterProfile, gpus: dict[str, list[int]]) -> ClusterProfile:
    """``profile`` with the GPUs of ``gpus`` (host -> indices) left out of its hosts' and spares'
    ``gpus``; a one-line refusal where a host's GPUs are unknown, or none would be left."""
    import dataclasses

    def narrowed(host: HostSpec) -> HostSpec:
        gone = gpus.get(host.host)
        if not gone:
            return host
        flag = f"--exclude {host.host}:{gone[0]}"
        if profile.device == "cpu":
            raise UsageError(f"{flag}: profile {profile.name} trains on the CPU", "exclude the host, or no GPU")
        if host.gpus is None:
            raise UsageError(f"{flag}: profile {profile.name} does not say which GPUs {host.host} has",
                             f"give them in the profile (hosts: [{{host: {host.host}, gpus: 8}}]; `fsdpctl init` "
                             f"writes them), or exclude the whole host")
        have = host.chosen_gpus or tuple(range(int(host.gpus)))
        unknown = [g for g in gone if g not in have]
        if unknown:
            raise UsageError(f"--exclude {host.host}:{unknown[0]}: not one of {host.host}'s GPUs "
                             f"({', '.join(map(str, have)) or 'none'})", "name one of them")
        left = tuple(g for g in have if g not in gone)
        if not left:
            raise UsageError(f"{flag}: leaves {host.host} no GPU", f"exclude the host instead: --exclude {host.host}")
        nproc = min(host.nproc, len(left)) if host.nproc else None
        return dataclasses.replace(host, gpus=left, nproc=nproc)

    return dataclasses.replace(profile, hosts=tuple(map(narrowed, profile.hosts)),
                               spares=tuple(map(narrowed, profile.spares)))


def excluded_hosts(profile: ClusterProfile, exclude: Sequence[str] = ()) -> dict[str, str]:
    """The hosts no run of ``profile`` may use now, with why: those remembered as excluded, and
    ``exclude`` (``launch --exclude``; a ``HOST:GPU`` there is a GPU's, not a host's). An unknown host,
    or hosts on a backend without spares, is refused."""
    from ..backends.registry import backend_class
    from .store import read_exclusions

    exclude, _ = split_exclude(profile, exclude)
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
    choice = choose_hosts(without_gpus(profile, split_exclude(profile, exclude)[1]), excluded)
    if choice.missing and not (min_nodes and len(choice.hosts) >= min_nodes):
        below = f"; fewer than min_nodes {min_nodes} left" if min_nodes else ""
        raise UsageError(f"profile {profile.name}: {choice.shortage(excluded)}{below}",
                         f"add spares: to the profile, or put a host back once it is healthy "
                         f"(`fsdpctl hosts -p {profile.name} --restore HOST`)")
    return choice
