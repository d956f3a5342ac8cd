"""apprise's one home: sending a notice to one apprise URL (Slack, Teams, Discord, ntfy, e-mail,
JSON webhooks...). Imported only when a notice is sent or a target checked, so ``fsdpctl --help``
never loads it."""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from .message import Message

INSTALL = "pip install 'fsdpctl[notify]' (or: pip install apprise)"
"""The fix when apprise is missing."""

_LEVELS = ("info", "success", "warning", "failure")
"""apprise's notify types, by the names ``Message.level`` uses."""


class SendFailed(Exception):
    """A try of a send failed; the text says why (never a secret URL)."""


def missing() -> Optional[str]:
    """None when apprise can be imported; else why not, in a few words."""
    try:
        import apprise  # noqa: F401
    except ImportError as exc:
        return f"apprise is not installed ({exc})"
    return None


def url_problem(url: str) -> Optional[str]:
    """None when apprise knows how to send to ``url``; else why not (without the URL itself)."""
    import apprise

    if apprise.Apprise.instantiate(url) is None:
        scheme = url.partition("://")[0]
        return f"apprise has no service {scheme}:// (or the URL lacks a part it needs)"
    return None


class _Heard(logging.Handler):
    """apprise says why a send failed only in its log: the lines each thread's send logged, so two
    targets sent at once never mix their reasons (and nothing reaches the terminal)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: dict[int, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        said = self.lines.get(record.thread or 0)
        if said is not None:
            said.append(record.getMessage())


_heard = _Heard()
_hooked = threading.Lock()


def _listen() -> _Heard:
    with _hooked:
        logger = logging.getLogger("apprise")
        if _heard not in logger.handlers:
            logger.addHandler(_heard)
    return _heard


def send(url: str, notice: Message, timeout: float) -> None:
    """One try to send ``notice`` to ``url``, its connect and read each bounded by ``timeout``
    seconds; SendFailed with apprise's own reason when it does not go."""
    import apprise

    heard, me = _listen(), threading.get_ident()
    heard.lines[me] = []
    try:
        plugin: Any = apprise.Apprise.instantiate(url)
        if plugin is None:
            raise SendFailed(url_problem(url) or "not an apprise URL")
        for name in ("socket_connect_timeout", "socket_read_timeout"):
            if hasattr(plugin, name):
                setattr(plugin, name, float(timeout))
        sent = plugin.notify(body=notice.body, title=notice.title,
                             notify_type=getattr(apprise.NotifyType,
                                                     (notice.level if notice.level in _LEVELS else "info").upper()))
        if not sent:
            said = heard.lines.get(me) or ["apprise could not send it (no reason given)"]
            raise SendFailed("; ".join(said[-2:]))
    finally:
        heard.lines.pop(me, None)
