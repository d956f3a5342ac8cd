"""Starting the dashboard: its token (kept for the next start in a file only this user reads, so an
open page reconnects by itself after a restart), its address, and what to tell the user."""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..errors import UsageError
from .server import DashboardServer, new_token

DEFAULT_PORT = 8787
PORT_TRIES = 20
"""Ports tried after the default one when it is taken (an explicit ``--port`` is not moved)."""


def token_file(state: Path) -> Path:
    return state / "dashboard.token"


def dashboard_token(state: Path, renew: bool = False) -> str:
    """The token the dashboard asks for: the one kept from the last start, or a new one (``renew``)."""
    path = token_file(state)
    if not renew:
        try:
            token = path.read_text(encoding="utf-8").strip()
            if len(token) >= 32:
                return token
        except OSError:
            pass
    token = new_token()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), 0o600)  # the token is readable by this user only
        handle.write(token + "\n")
    return token


@dataclass(frozen=True)
class Started:
    server: DashboardServer
    url: str
    """The page's address with the token (for this user only: it opens the dashboard)."""
    tunnel: Optional[str]
    """The ``ssh -L`` line that reaches it from a laptop (when this is a remote machine's loopback)."""
    exposed: bool
    """It answers on an address other machines reach."""


def start_dashboard(runs_dir: Path, state: Path, host: str = "127.0.0.1", port: Optional[int] = None,
                    renew_token: bool = False) -> Started:
    """The server, bound and ready (``serve_forever`` serves it)."""
    token = dashboard_token(state, renew_token)
    ports = [port] if port is not None else [DEFAULT_PORT + i for i in range(PORT_TRIES)] + [0]
    last: Optional[OSError] = None
    for candidate in ports:
        try:
            server = DashboardServer(host, candidate, runs_dir, token)
            break
        except OSError as exc:
            last = exc
            if exc.errno not in (errno.EADDRINUSE, errno.EACCES) or port is not None:
                raise UsageError(f"--host {host} --port {candidate}: cannot listen there ({exc.strerror})",
                                 "give a free --port, and an address of this machine as --host") from None
    else:
        raise UsageError(f"no free port from {DEFAULT_PORT} ({last})", "give one with --port")
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    loopback = _loopback(host)
    wildcard = host in ("0.0.0.0", "::")  # noqa: S104 - said to the user as exposed
    url = f"http://{socket.getfqdn() if wildcard else shown}:{bound}/?token={token}"
    tunnel = (f"ssh -N -L {bound}:127.0.0.1:{bound} {os.environ.get('USER', 'you')}@{socket.getfqdn()}"
              if loopback else None)
    return Started(server, url, tunnel, not loopback)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
