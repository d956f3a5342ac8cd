"""``hosts``: which of a profile's hosts a run uses (active), keeps in reserve (spare) or leaves out
(excluded: why, since when, by which run), and putting an excluded host back once it checks out.
(``hostpool.placing.place_hosts`` is what every launch of a profile goes through.)"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Optional

from ..errors import UsageError
from .events import Emitter, EventHandler, HostChecked
from .prepare import ProfileLike, load_profile

if TYPE_CHECKING:
    from ..profiles.schema import ClusterProfile

Role = Literal["active", "spare", "excluded"]


@dataclass(frozen=True)
class HostInfo:
    """One host of a profile and its part in the next run."""

    host: str
    role: Role
    node_rank: Optional[int] = None
    """Its node rank in the next run (an active host)."""
    replaces: Optional[str] = None
    """The excluded host an active spare stands in for."""
    reason: Optional[str] = None
    """Why it is excluded."""
    run_id: Optional[str] = None
    """The run whose failure excluded it."""
    since: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        """The host as ``hosts --json`` prints it (no empty fields)."""
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def describe(self) -> str:
        """The host in one line, as ``fsdpctl hosts`` prints it."""
        if self.role == "excluded":
            by = f" by run {self.run_id}" if self.run_id else ""
            return f"{self.host}\texcluded\t{self.reason} (since {self.since}{by})"
        if self.role == "active":
            instead = f" in the place of {self.replaces}" if self.replaces else ""
            return f"{self.host}\tactive\tnode {self.node_rank}{instead}"
        return f"{self.host}\tspare"


def hosts(profile: ProfileLike, *, restore: Optional[str] = None, exclude: Optional[str] = None,
          reason: str = "excluded by hand", on_event: Optional[EventHandler] = None) -> list[HostInfo]:
    """Every host of ``profile``: active (its node rank in the next run, and the excluded host a spare
    stands in for), spare, or excluded (why, since when, by which run). ``restore``: first put that
    excluded host back, once doctor's fast checks pass on it beside the active hosts (UsageError
    naming the failed check otherwise). ``exclude``: first leave that host out of every run of the
    profile until it is restored, with ``reason``."""
    from ..hostpool.choice import choose_hosts
    from ..hostpool.placing import excluded_hosts
    from ..hostpool.store import read_exclusions

    loaded = load_profile(profile)
    prof = loaded.profile
    if restore is not None:
        from ..job import Job, JobOptions
        from .prepare import environment_of

        restore_host(prof, restore, Emitter(on_event), environment_of(loaded, Job(), JobOptions()))
    if exclude is not None:
        exclude_host(prof, exclude, reason)
    choice = choose_hosts(prof, excluded_hosts(prof))
    instead = {r.by: r.host for r in choice.replacements}
    found = [HostInfo(h.host, "active", node_rank=rank, replaces=instead.get(h.host))
             for rank, h in enumerate(choice.profile.hosts)]
    found += [HostInfo(h.host, "spare") for h in choice.profile.spares]
    remembered = read_exclusions(prof.name)
    found += [HostInfo(e.host, "excluded", reason=e.reason, run_id=e.run_id, since=e.since)
              for h in (*prof.hosts, *prof.spares) if (e := remembered.get(h.host)) is not None]
    return found


def restore_host(profile: ClusterProfile, host: str, emit: Emitter, environment: Any = None) -> None:
    """Put an excluded ``host`` back once doctor's fast checks pass on it (beside the active hosts,
    so a torch or Python that differs from theirs counts; in the profile's ``environment`` where the
    hosts hold it, launch making it where they do not)."""
    from ..backends import backend_for
    from ..hostpool.blame import unfit_hosts
    from ..hostpool.choice import choose_hosts
    from ..hostpool.placing import excluded_hosts
    from ..hostpool.store import read_exclusions, remove_exclusion

    remembered = read_exclusions(profile.name)
    if host not in remembered:
        raise UsageError(f"--restore {host}: not excluded from profile {profile.name}",
                         f"see `fsdpctl hosts -p {profile.name}`; excluded now: {', '.join(remembered) or 'none'}")
    active = choose_hosts(profile, excluded_hosts(profile)).profile.hosts
    spec = next(h for h in (*profile.hosts, *profile.spares) if h.host == host)
    backend = backend_for(profile)
    try:
        report = backend.check_hosts([spec, *active], on_host=lambda found: emit(HostChecked(found)),
                                     environment=environment)
    finally:
        backend.close()
    unfit = unfit_hosts(report, trusted=[h.host for h in active])
    if host in unfit:
        raise UsageError(f"--restore {host}: it still fails its check ({unfit[host]})",
                         "fix it (see `fsdpctl doctor`), then restore it")
    remove_exclusion(profile.name, host)
    emit.notice(f"{host} restored to profile {profile.name}: it passed its checks", "success")


def exclude_host(profile: ClusterProfile, host: str, reason: str) -> None:
    """Leave ``host`` out of every run of ``profile`` until it is restored (refused when it is no host
    of the profile, or when the runs would then lack a host)."""
    from ..hostpool.placing import excluded_hosts, place_hosts
    from ..hostpool.store import Exclusion, add_exclusions
    from ..plan.elastic import min_nodes_of
    from ..rundir.record import now

    excluded_hosts(profile, (host,))  # an unknown host, or a backend without spares, is refused here
    # and so is one whose runs would then lack a host (an elastic profile's: go below its min_nodes)
    place_hosts(profile, (host,), min_nodes_of(profile))
    add_exclusions(profile.name, [Exclusion(host, reason, None, now())])
