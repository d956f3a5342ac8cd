"""The environment part of a plan: what a node's environment is made from, where it lives there, and
the path the ranks' Python has on every node (the same on each, whatever each node's platform)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ..shell import join_path

STAGED_ENVIRONMENT = "environment"
"""A scheduler's run directory's folder with the environment's request, wheels and uv, for the job's first step."""


@dataclass(frozen=True, kw_only=True)
class EnvPlan:
    """An ``environment`` section made concrete: its files' contents travel with the plan, so a later
    attempt (or a resume) makes the same environment without reading them again."""

    files: Mapping[str, str] = field(default_factory=dict)
    """What it is made from, by kind: ``requirements.txt`` (the lines, the section's ``packages``
    included), or ``pyproject.toml`` with ``uv.lock`` when there is one."""
    source: str = ""
    """Where it came from, for messages (``requirements.txt``, ``uv.lock``, ``packages``)."""
    index_url: Optional[str] = None
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    torch_backend: str = "auto"
    install: str = "auto"
    keep: int = 3
    root: str = ""
    """Where each node keeps its environments (``<workdir>/envs`` unless the section says)."""
    base_python: str = ""
    """The Python each node's environment is made from (the profile's ``python``)."""
    name: str = ""
    """``env-<digest>`` of everything above: a link on each node to the key its platform gives."""

    @property
    def python(self) -> str:
        """The ranks' Python on every node."""
        return join_path(self.root, self.name, "bin", "python")

    def placed(self, workdir: str, base_python: str) -> EnvPlan:
        """This plan as the nodes of a profile with ``workdir`` hold it: under its own ``root``, else
        ``<workdir>/envs``, made from ``base_python``, named."""
        return self.named(self.root or join_path(workdir, "envs"), base_python)

    def named(self, root: str, base_python: str) -> EnvPlan:
        """This plan placed under ``root`` and made from ``base_python``, with its name."""
        placed = dataclasses.replace(self, root=root, base_python=base_python, name="")
        digest = hashlib.sha256(json.dumps(dataclasses.asdict(placed), sort_keys=True).encode()).hexdigest()
        return dataclasses.replace(placed, name=f"env-{digest[:12]}")


def env_plan_from_json(data: Optional[dict[str, Any]]) -> Optional[EnvPlan]:
    """``dataclasses.asdict(plan)`` back as an EnvPlan (None stays None)."""
    if not data:
        return None
    return EnvPlan(**{**data, "extra_index_urls": tuple(data.get("extra_index_urls", ())),
                      "find_links": tuple(data.get("find_links", ())), "files": dict(data.get("files", {}))})
