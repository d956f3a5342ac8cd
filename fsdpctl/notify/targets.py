"""Where notices go: an apprise URL (given in the profile, or as the value of a secret variable) or a
command of the user's. A target is named without its secret: ``secret SLACK_HOOK``, ``json://host``."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import UsageError
from .apprise_send import INSTALL, SendFailed
from .message import Message, plain

__all__ = ["AppriseTarget", "CommandTarget", "SendFailed", "Target", "check_targets", "targets_for"]


class Target(Protocol):
    """Something a notice can be sent to: ``name`` (safe to show and to write down) and one try of a send."""

    name: str

    def send(self, notice: Message, timeout: float) -> None: ...


@dataclass(frozen=True)
class AppriseTarget:
    """An apprise URL; ``hidden``: the parts of it never shown (a secret URL's tokens)."""

    name: str
    url: str = field(repr=False)
    hidden: tuple[str, ...] = field(default=(), repr=False)

    def send(self, notice: Message, timeout: float) -> None:
        from .apprise_send import send

        try:
            send(self.url, notice, timeout)
        except SendFailed as exc:
            raise SendFailed(self.masked(str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - a plugin's own error is one failed try like any other
            raise SendFailed(self.masked(f"{type(exc).__name__}: {exc}")) from None

    def masked(self, text: str) -> str:
        for part in sorted(self.hidden, key=len, reverse=True):
            text = text.replace(part, "***")
        return text


@dataclass(frozen=True)
class CommandTarget:
    """A program run once per notice, the notice as JSON on its stdin (never through a shell)."""

    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"command {plain(self.argv[0])}"

    def send(self, notice: Message, timeout: float) -> None:
        env = {**os.environ, "FSDPCTL_NOTIFY_EVENT": notice.event, "FSDPCTL_RUN_ID": notice.run_id}
        try:
            done = subprocess.run(list(self.argv), input=notice.to_json(), env=env, capture_output=True, text=True,
                                  timeout=timeout, stdin=None, check=False)
        except subprocess.TimeoutExpired:
            raise SendFailed(f"still running after {timeout:g} s (killed)") from None
        except OSError as exc:
            raise SendFailed(f"cannot run it: {exc.strerror or exc}") from None
        if done.returncode != 0:
            last = (done.stderr or done.stdout or "").strip().splitlines()
            raise SendFailed(f"exit {done.returncode}" + (f": {plain(last[-1])}" if last else ""))


def _shown(url: str) -> str:
    """An apprise URL as it may be shown: its scheme and host, no user, password, path or query."""
    scheme, _, rest = url.partition("://")
    host = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    return f"{scheme}://{host}"


def _secret_parts(url: str) -> tuple[str, ...]:
    """What of a secret URL is never shown: the whole, and each part of it long enough to be a token."""
    parts = [p for p in re.split(r"[/:@?&=#]+", url.partition("://")[2]) if len(p) >= 4]
    return (url, *parts)


def targets_for(spec, environ: Mapping[str, str] | None = None) -> list[Target]:
    """The targets of a profile's ``notify`` section (a ``NotifySpec``), the secret URLs read from
    ``environ`` (default: this process's environment); a missing secret is a UsageError."""
    environ = os.environ if environ is None else environ
    targets: list[Target] = [AppriseTarget(f"urls[{i}] {_shown(url)}", url) for i, url in enumerate(spec.urls)]
    for name in spec.secrets:
        value = environ.get(name, "").strip()
        if not value:
            raise UsageError(f"notify.secrets: {name} is not set in this environment",
                             f"export {name}=<an apprise URL> before the launch, or drop it from notify.secrets")
        targets.append(AppriseTarget(f"secret {name}", value, _secret_parts(value)))
    if spec.command:
        targets.append(CommandTarget(tuple(spec.command)))
    return targets


def check_targets(spec, environ: Mapping[str, str] | None = None) -> list[Target]:
    """``targets_for``, with what would make every send fail said now, in one line: a secret not set,
    apprise not installed, a URL apprise cannot send to."""
    from .apprise_send import missing, url_problem

    targets = targets_for(spec, environ)
    urls = [t for t in targets if isinstance(t, AppriseTarget)]
    if urls and (why := missing()):
        raise UsageError(f"notify: sending to {urls[0].name} needs apprise, and {why}", INSTALL)
    for target in urls:
        if problem := url_problem(target.url):
            where = target.name.split()[0] if target.name.startswith("urls[") else f"secrets: {target.name.split()[1]}"
            raise UsageError(f"notify.{where}: {problem}",
                             "see https://github.com/caronc/apprise/wiki for each service's URL")
    return targets
