"""Choosing a run's hosts from a profile's hosts and spares, given the hosts excluded (pure).

Each excluded host's place goes to the first spare not excluded and not yet used, so node ranks stay
in the profile's host order with the spare where the host it replaces was; the rendezvous moves to
the first node when the host that held it is excluded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..profiles.schema import ClusterProfile
from ..rundir.status import Replacement


@dataclass(frozen=True)
class HostChoice:
    """The profile as a run places it (``hosts``: the active hosts, spares in place; ``spares``: the
    ones left), the replacements made, and the excluded hosts no spare was left for."""

    profile: ClusterProfile
    replacements: tuple[Replacement, ...]
    missing: tuple[str, ...]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h.host for h in self.profile.hosts)

    @property
    def full(self) -> int:
        """The nodes the profile asks for: those placed and those missing."""
        return len(self.profile.hosts) + len(self.missing)

    def shortage(self, excluded: Mapping[str, str]) -> str:
        """Why the run cannot have all its hosts, in one line (for a choice with ``missing``)."""
        wanted = len(self.profile.hosts) + len(self.missing)
        why = "; ".join(f"{host}: {excluded[host]}" for host in self.missing)
        return (f"{len(self.missing)} of its {wanted} hosts excluded and no spare left ({why}): "
                f"{len(self.missing)} host(s) missing")


def reasons(hosts: Sequence[str], excluded: Mapping[str, str]) -> str:
    """Why ``hosts`` are out, in a few words: one host's reason alone, several as ``host: reason; ...``."""
    if len(hosts) == 1:
        return excluded.get(hosts[0], "excluded")
    return "; ".join(f"{host}: {excluded.get(host, 'excluded')}" for host in hosts)


def choose_hosts(profile: ClusterProfile, excluded: Mapping[str, str]) -> HostChoice:
    """``profile``'s hosts with each one in ``excluded`` (host -> why) replaced by a spare."""
    spares = [s for s in profile.spares if s.host not in excluded]
    active, replacements, missing = [], [], []
    for host in profile.hosts:
        if host.host not in excluded:
            active.append(host)
        elif spares:
            spare = spares.pop(0)
            active.append(spare)
            replacements.append(Replacement(host.host, spare.host, excluded[host.host]))
        else:
            missing.append(host.host)
    rendezvous = profile.rendezvous
    if rendezvous.host is not None and rendezvous.host not in [h.host for h in active]:
        rendezvous = dataclasses.replace(rendezvous, host=None)  # the first node holds it now
    placed = dataclasses.replace(profile, hosts=tuple(active), spares=tuple(spares), rendezvous=rendezvous)
    return HostChoice(placed, tuple(replacements), tuple(missing))
