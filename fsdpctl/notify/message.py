"""A notice as it is sent: its event, a title a person reads first, a plain-text body, and the same
facts as fields for a program (the ``command`` target gets them as JSON)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

MAX_VALUE = 300
"""Characters of one value kept in a body (a failure's last line can be a page of a traceback)."""


@dataclass(frozen=True)
class Message:
    """One notice: ``event`` (a ``notify.events`` name), ``run_id``, ``title``, ``body`` and ``fields``."""

    event: str
    run_id: str
    title: str
    body: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    level: str = "info"
    """How apprise colours it: info, success, warning or failure."""

    def to_json(self) -> str:
        """What the ``command`` target reads on its stdin."""
        own = {k: v for k, v in self.fields.items() if k not in ("event", "run_id")}
        data = {"event": self.event, "run_id": self.run_id, "title": self.title, "body": self.body, **own}
        return json.dumps(data, default=str) + "\n"


def plain(value: Any) -> str:
    """A value as one line of plain text: hosts, errors and paths come from users and their programs,
    so control characters (a terminal's escapes, a newline that would forge a line) go."""
    text = " ".join(str(value).split())
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 3] + "..."


def message(event: str, run_id: str, headline: str, facts: Mapping[str, Any], level: str = "info",
            extra: Optional[Mapping[str, Any]] = None) -> Message:
    """The notice of ``event`` of run ``run_id``: its title ``fsdpctl: run <id> <headline>``, its body
    the ``event:`` line, then one ``name: value`` line per fact (None left out)."""
    kept = {name: value for name, value in facts.items() if value is not None and value != ""}
    title = plain(f"fsdpctl: run {run_id} {headline}")
    lines = [f"{name.replace('_', ' ')}: {plain(value)}" for name, value in kept.items()]
    body = "\n".join([f"event: {event}", *lines])
    return Message(event, run_id, title, body, {**kept, **(extra or {})}, level)
