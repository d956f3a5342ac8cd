"""``fsdpctl env``: the Python environments fsdpctl made on a profile's nodes (``environment:``), listed
with what each holds and its size, and pruned."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .events import Emitter, EventHandler
from .options import PathLike
from .prepare import ProfileLike, load_profile


@dataclass(frozen=True)
class NodeEnvironment:
    """One environment on one node."""

    key: str
    names: tuple[str, ...]
    """The profiles' environment names that point at it on this node."""
    current: bool
    """The profile's environment, as it is now, runs in this one."""
    created: float
    used: float
    bytes: int
    """Its size on disk, each file counted once on the node (uv links files from its cache)."""
    packages: dict[str, str] = field(default_factory=dict)
    source: str = ""


@dataclass(frozen=True)
class NodeEnvironments:
    """What one node holds under the environment root."""

    host: str
    node_rank: int
    root: str
    environments: tuple[NodeEnvironment, ...] = ()
    wheels: int = 0
    removed: tuple[str, ...] = ()
    error: Optional[str] = None


def environments(profile: ProfileLike, *, prune: bool = False, keep: Optional[int] = None, make: bool = False,
                 env_from: Optional[PathLike] = None, on_event: Optional[EventHandler] = None
                 ) -> list[NodeEnvironments]:
    """Every node's environments (the profile's ``environment`` root, or ``env_from``'s); with ``make``,
    first make the environment on every node as a launch would (ahead of a run); with ``prune``,
    remove all but the ``keep`` most recently used (default: the section's ``keep``), never one in
    use, nor the profile's own. ``make``'s progress and each node's part reach ``on_event``."""
    from ..backends import backend_for
    from ..errors import UsageError
    from ..job import Job, JobOptions
    from .prepare import environment_of

    loaded = load_profile(profile)
    options = JobOptions(env_from=Path(env_from).expanduser() if env_from is not None else None)
    plan = environment_of(loaded, Job(), options)
    if plan is None:
        raise UsageError(f"profile {loaded.name}: has no environment section",
                         "add environment: with file: uv.lock (or requirements.txt), or give --env-from FILE")
    backend = backend_for(loaded.profile)
    try:
        if make:
            from .following import make_environment
            from .launching import prepare

            made = prepare(loaded, options=options)
            make_environment(backend, made.plan, Emitter(on_event))
        answers = backend.node_environments(plan, prune=prune, keep=keep if keep is not None else plan.keep)
    finally:
        backend.close()
    return [_node(answer) for answer in answers]


def _node(answer: dict[str, Any]) -> NodeEnvironments:
    facts = answer.get("facts")
    if facts is None:
        return NodeEnvironments(answer["host"], answer["node_rank"], answer.get("root", ""),
                                error=answer.get("error") or "its Python could not run the helper")
    names: dict[str, list[str]] = {}
    for name, key in facts.get("names", {}).items():
        names.setdefault(key, []).append(name)
    found = []
    for key, record in sorted(facts.get("ready", {}).items(), key=lambda item: -item[1].get("used", 0)):
        found.append(NodeEnvironment(key, tuple(sorted(names.get(key, ()))), key == answer.get("current"),
                                     record.get("created", 0.0), record.get("used", 0.0),
                                     int(facts.get("sizes", {}).get(key, 0)), dict(record.get("packages", {})),
                                     record.get("source", "")))
    return NodeEnvironments(answer["host"], answer["node_rank"], facts.get("root", ""), tuple(found),
                            len([w for w in facts.get("wheels", []) if w.endswith(".whl")]),
                            tuple(answer.get("removed", ())))
