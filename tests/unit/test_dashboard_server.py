"""The dashboard's server on loopback, asked over real HTTP: the token (first visit, then a cookie), what
is refused (no token, a wrong one, a foreign Host header, a cross-origin or CSRF-less POST, a path out of
the runs directory or the static files), what a run's page holds, the event stream, and the token file
readable by this user only."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
import threading

import pytest

from fsdpctl.live import layout
from fsdpctl.web.serve import dashboard_token, start_dashboard
from tests.unit.test_live_model import new_run, row, write


@pytest.fixture
def dashboard(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    run = new_run(runs)
    write(layout.collected(run.root, 0, "metrics.jsonl"), "".join(row(s, 1000.0 + s) for s in range(1, 21)))
    write(run.paths.logs / "merged.log", "[10.9.0.1 r0] <script>alert(1)</script>\n")
    started = start_dashboard(runs, tmp_path / "state", "127.0.0.1", 0)
    thread = threading.Thread(target=started.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield started, run
    finally:
        started.server.shutdown()
        started.server.server_close()


def ask(started, method: str, path: str, headers: dict | None = None, host: str | None = None):
    port = started.server.server_address[1]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = dict(headers or {})
    connection.putrequest(method, path, skip_host=True)
    connection.putheader("Host", host or f"127.0.0.1:{port}")
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders()
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    return answer.status, dict(answer.getheaders()), body


def cookie(started) -> dict:
    return {"Cookie": f"fsdpctl_token={started.server.token}"}


def test_the_token_opens_the_page_once_then_a_cookie_keeps_it_open(dashboard):
    started, _ = dashboard
    status, headers, _ = ask(started, "GET", "/?token=" + started.server.token)
    assert status == 303 and headers["Location"] == "/"
    assert f"fsdpctl_token={started.server.token}" in headers["Set-Cookie"]
    assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
    status, headers, body = ask(started, "GET", "/", cookie(started))
    assert status == 200 and b"/static/app.js" in body
    assert "script-src 'self'" in headers["Content-Security-Policy"] and headers["X-Frame-Options"] == "DENY"
    for name in ("app.js", "style.css", "uplot.js", "uplot.css"):
        assert ask(started, "GET", f"/static/{name}", cookie(started))[0] == 200


@pytest.mark.parametrize(("what", "path", "headers", "host", "code"), [
    ("no token", "/api/runs", {}, None, 401),
    ("a wrong token in the URL", "/?token=not-the-token", {}, None, 401),
    ("a wrong cookie", "/api/runs", {"Cookie": "fsdpctl_token=guess"}, None, 401),
    ("a foreign Host (DNS rebinding)", "/api/runs", "cookie", "evil.example:8787", 403),
    ("a foreign Host, with the token in the URL", "/?token=TOKEN", {}, "evil.example", 403),
    ("a path out of the static files", "/static/../server.py", "cookie", None, 404),
    ("a static file by another name", "/static/index.html", "cookie", None, 404),
    ("a run id with ..", "/api/runs/..%2F..%2Fetc", "cookie", None, 404),
    ("a run id that is no run", "/api/runs/t-20990101-000000-0000", "cookie", None, 404),
    ("a script by a path", "/api/runs/RUN/scripts/..%2Fplan.json", "cookie", None, 404),
    ("a profile name with /", "/api/hosts/..%2Fx", "cookie", None, 404),
])
def test_what_is_refused(dashboard, what, path, headers, host, code):
    started, run = dashboard
    headers = cookie(started) if headers == "cookie" else headers
    path = path.replace("RUN", run.run_id).replace("TOKEN", started.server.token)
    status, _, body = ask(started, "GET", path, headers, host)
    assert status == code, (what, status, body)
    assert started.server.token.encode() not in body


def test_actions_need_post_the_csrf_header_and_this_servers_origin(dashboard):
    started, run = dashboard
    port = started.server.server_address[1]
    stop = f"/api/runs/{run.run_id}/stop"
    csrf = json.loads(ask(started, "GET", "/api/session", cookie(started))[2])["csrf"]
    own = {"Origin": f"http://127.0.0.1:{port}", **cookie(started)}
    assert ask(started, "GET", stop, cookie(started))[0] == 404  # an action is never a GET
    assert ask(started, "POST", stop, {**own})[0] == 403  # no CSRF header
    assert ask(started, "POST", stop, {**own, "X-Fsdpctl-Csrf": "guess"})[0] == 403
    assert ask(started, "POST", stop, {**cookie(started), "Origin": "http://evil.example",
                                       "X-Fsdpctl-Csrf": csrf})[0] == 403  # cross-origin
    assert ask(started, "POST", stop, {**cookie(started), "X-Fsdpctl-Csrf": csrf})[0] == 403  # no Origin
    assert ask(started, "POST", stop, {"Origin": own["Origin"], "X-Fsdpctl-Csrf": csrf})[0] == 401  # no cookie
    assert ask(started, "DELETE", f"/api/runs/{run.run_id}", cookie(started))[0] == 405


def test_a_runs_page_lists_it_and_its_page_holds_what_it_wrote_as_data(dashboard):
    started, run = dashboard
    status, _, body = ask(started, "GET", "/api/runs", cookie(started))
    rows = json.loads(body)["runs"]
    assert status == 200 and [r["run_id"] for r in rows] == [run.run_id] and rows[0]["step"] == 20
    status, _, body = ask(started, "GET", f"/api/runs/{run.run_id}", cookie(started))
    page = json.loads(body)
    assert page["snapshot"]["run"]["step"] == 20 and page["snapshot"]["logs"][-1]["text"] == "<script>alert(1)</script>"
    assert page["charts"]["train"]["loss"]["x"][-1] == 20 and len(page["charts"]["heat"]["ranks"]) == 2
    assert b"<script>" not in body  # JSON writes it as data: the page shows it with textContent
    script = page["scripts"][0]
    status, _, body = ask(started, "GET", f"/api/runs/{run.run_id}/scripts/{script}", cookie(started))
    assert status == 200 and json.loads(body)["text"].startswith("#!")


def test_the_event_stream_sends_the_page_then_what_changes(dashboard):
    started, run = dashboard
    port = started.server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET /api/events/run/{run.run_id} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
                     f"Cookie: fsdpctl_token={started.server.token}\r\n\r\n".encode())
        got = b""
        while got.count(b"event: update") < 1:
            got += sock.recv(65536)
        write(layout.collected(run.root, 0, "metrics.jsonl"), row(21, 1021.0))
        while got.count(b"event: update") < 2:
            got += sock.recv(65536)
    assert b"text/event-stream" in got and b"retry: 2000" in got
    last = got.rsplit(b"event: update\ndata: ", 1)[1].split(b"\n\n", 1)[0]
    assert json.loads(last)["snapshot"]["run"]["step"] == 21


def test_nothing_answers_on_another_address_and_the_token_file_is_this_users_alone(dashboard, tmp_path):
    started, _ = dashboard
    port = started.server.server_address[1]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", port), timeout=2).close()
    path = tmp_path / "state" / "dashboard.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() == started.server.token
    assert dashboard_token(tmp_path / "state") == started.server.token  # kept: an open page reconnects
    assert dashboard_token(tmp_path / "state", renew=True) != started.server.token
    assert not (set(os.listdir(tmp_path / "state")) - {"dashboard.token"})
    assert started.url == f"http://127.0.0.1:{port}/?token={started.server.token}"


def test_the_profile_action_on_a_run_that_ended_answers_why_not(dashboard):
    from fsdpctl.rundir.state import RunState

    started, run = dashboard
    run.change(state=RunState.SUCCEEDED)  # nothing of it runs: no node is asked anything
    port = started.server.server_address[1]
    csrf = json.loads(ask(started, "GET", "/api/session", cookie(started))[2])["csrf"]
    headers = {"Origin": f"http://127.0.0.1:{port}", "X-Fsdpctl-Csrf": csrf, **cookie(started)}
    assert ask(started, "POST", f"/api/runs/{run.run_id}/profile", {k: v for k, v in headers.items()
                                                                     if k != "X-Fsdpctl-Csrf"})[0] == 403
    status, _, body = ask(started, "POST", f"/api/runs/{run.run_id}/profile", headers)
    assert status == 409 and "no rank is left to profile" in json.loads(body)["error"], body
