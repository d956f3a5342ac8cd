"""``fsdpctl dashboard``'s server: the standard library's threading HTTP server, one page and its data,
safe by default.

- Loopback unless told otherwise. Every request needs the token: ``/?token=...`` (the URL printed at
  start) sets an HttpOnly, SameSite=Strict cookie and sends the browser on without the token in its
  address; every other request is refused without the cookie.
- A request whose Host header is not this server's (DNS rebinding) is refused.
- Actions (stop, stacks) only as POST, with the cookie, a CSRF header the page gets from
  ``/api/session``, and an Origin that is this server's.
- Only known names are served: the page, its script, its style and the vendored chart library; run
  data only by exact run id inside the runs directory; a run's scripts only by a name its scripts
  folder lists. A Content-Security-Policy lets the page run no script but its own, inline none.
- Everything a run wrote (log lines, host names, command lines) reaches the page as JSON, which the
  page shows as text only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import threading
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit

from .hub import Hub
from .report_html import embedded_json as safe_json

STATIC = Path(__file__).resolve().parent / "static"
FILES = {"app.js": ("app.js", "text/javascript"), "style.css": ("style.css", "text/css"),
         "uplot.js": ("vendor/uplot/uPlot.iife.min.js", "text/javascript"),
         "uplot.css": ("vendor/uplot/uPlot.min.css", "text/css")}
PAGES = ("/", "/runs", "/run/", "/hosts/")
COOKIE = "fsdpctl_token"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
KEEPALIVE_SECONDS = 15.0


class DashboardServer(ThreadingHTTPServer):
    """The server, its token and what it may be called (Host headers it answers to)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, runs_dir: Path, token: str):
        super().__init__((host, port), Handler)
        self.token = token
        self.csrf = hmac.new(token.encode(), b"csrf", hashlib.sha256).hexdigest()
        self.hub = Hub(runs_dir)
        self.runs_dir = runs_dir
        self.names = served_names(host, self.server_address[1])
        self.closing = threading.Event()

    def server_close(self) -> None:
        self.closing.set()
        self.hub.close()
        super().server_close()


def served_names(host: str, port: int) -> set[str]:
    """The Host headers this server answers to: its own address, and for loopback ``localhost`` too;
    for an address reached from elsewhere, this machine's names and addresses (never a name a page's
    DNS could point here: that is DNS rebinding)."""
    names = {host}
    if host in ("127.0.0.1", "::1", "localhost", "0.0.0.0", "::"):  # noqa: S104 - the wildcards reach loopback too
        names |= {"127.0.0.1", "localhost", "[::1]"}
    if host not in ("127.0.0.1", "::1", "localhost"):
        names |= {socket.gethostname(), socket.getfqdn()}
        try:
            names |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
        except OSError:
            pass
    return {f"{name}:{port}" for name in names} | ({f"[{host}]:{port}"} if ":" in host else set())


class Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "fsdpctl-dashboard"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None  # requests are not logged (their URLs may hold the token)

    # ---- the guards ------------------------------------------------------------------------------
    def _host_ok(self) -> bool:
        return (self.headers.get("Host") or "") in self.server.names

    def _cookie_ok(self) -> bool:
        cookie = SimpleCookie()
        try:
            cookie.load(self.headers.get("Cookie") or "")
        except Exception:  # noqa: BLE001 - a malformed cookie header is no token
            return False
        given = cookie.get(COOKIE)
        return given is not None and hmac.compare_digest(given.value.encode(), self.server.token.encode())

    def _refuse(self, code: int, why: str) -> None:
        self._send(code, {"error": why})

    def _guard(self) -> bool:
        if not self._host_ok():
            self._refuse(403, "unknown Host: this dashboard answers to its own address only")
            return False
        if not self._cookie_ok():
            self._refuse(401, "no valid token: open the URL fsdpctl dashboard printed")
            return False
        return True

    # ---- answers ---------------------------------------------------------------------------------
    def _headers(self, code: int, content_type: str, length: Optional[int] = None,
                 extra: Optional[dict[str, str]] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        if length is not None:
            self.send_header("Content-Length", str(length))
        for name, value in {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                            "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
                            "Cache-Control": "no-store", "Cross-Origin-Resource-Policy": "same-origin",
                            **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()

    def _send(self, code: int, data: Any) -> None:
        body = safe_json(data).encode()
        self._headers(code, "application/json; charset=utf-8", len(body))
        self.wfile.write(body)

    def _file(self, name: str) -> None:
        path, kind = FILES[name]
        body = (STATIC / path).read_bytes()
        self._headers(200, f"{kind}; charset=utf-8", len(body))
        self.wfile.write(body)

    # ---- GET -------------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        url = urlsplit(self.path)
        if not self._host_ok():
            self._refuse(403, "unknown Host: this dashboard answers to its own address only")
            return
        token = parse_qs(url.query).get("token", [None])[0]
        if url.path == "/" and token is not None:
            if not hmac.compare_digest(token.encode(), self.server.token.encode()):
                self._refuse(401, "wrong token: open the URL fsdpctl dashboard printed")
                return
            self._headers(303, "text/plain; charset=utf-8", 0, {
                "Location": "/", "Set-Cookie": f"{COOKIE}={self.server.token}; HttpOnly; SameSite=Strict; Path=/"})
            return
        if not self._cookie_ok():
            self._refuse(401, "no valid token: open the URL fsdpctl dashboard printed")
            return
        try:
            self._route_get(url.path, parse_qs(url.query))
        except (BrokenPipeError, ConnectionResetError):
            return

    def _route_get(self, path: str, query: dict[str, list[str]]) -> None:
        from . import routes

        if path == "/" or path.startswith(PAGES[1:]):
            body = (STATIC / "index.html").read_bytes()
            self._headers(200, "text/html; charset=utf-8", len(body))
            self.wfile.write(body)
        elif path.startswith("/static/") and path[len("/static/"):] in FILES:
            self._file(path[len("/static/"):])
        elif path == "/api/session":
            self._send(200, {"csrf": self.server.csrf})
        elif path == "/api/events/runs":
            self._stream(self.server.hub.runs_payload())
        elif path.startswith("/api/events/run/"):
            run = routes.find_run(self.server.runs_dir, path[len("/api/events/run/"):])
            if run is None:
                self._refuse(404, "no such run")
                return
            self._stream(self.server.hub.run_payload(run))
        else:
            code, data = routes.get(self.server, path, query)
            self._send(code, data)

    def _stream(self, payload: Any) -> None:
        """Server-sent events: the payload each time it changes (a comment every few seconds meanwhile);
        the page's EventSource reconnects by itself when the server goes and comes back."""
        self._headers(200, "text/event-stream; charset=utf-8")
        self.wfile.write(b"retry: 2000\n\n")
        version = 0
        while not self.server.closing.is_set():
            newer, data = payload.wait_newer(version, KEEPALIVE_SECONDS)
            if newer > version and data is not None:
                version = newer
                self.wfile.write(b"event: update\ndata: " + safe_json(data).encode() + b"\n\n")
            else:
                self.wfile.write(b": still here\n\n")
            self.wfile.flush()

    # ---- POST ------------------------------------------------------------------------------------
    def do_POST(self) -> None:  # noqa: N802 - the base class's name
        if not self._guard():
            return
        origin = self.headers.get("Origin")
        if origin is None or urlsplit(origin).netloc not in self.server.names:
            self._refuse(403, "cross-origin request refused")
            return
        if not hmac.compare_digest((self.headers.get("X-Fsdpctl-Csrf") or "").encode(), self.server.csrf.encode()):
            self._refuse(403, "missing or wrong CSRF header")
            return
        from . import routes

        try:
            code, data = routes.post(self.server, urlsplit(self.path).path)
            self._send(code, data)
        except (BrokenPipeError, ConnectionResetError):
            return

    def do_PUT(self) -> None:  # noqa: N802
        self._refuse(405, "not allowed")

    do_DELETE = do_PATCH = do_PUT


def new_token() -> str:
    return secrets.token_urlsafe(32)
