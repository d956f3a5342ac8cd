"""A page of another origin, for the dashboard's browser tests: served on 127.0.0.2 (in whatever
network namespace it is started), it tries the dashboard with the browser's cookies: read the runs,
stop a run with a guessed CSRF header, and stop it with a "simple" request. What each try got lands in
``window.results``.

``python -m tests.testbed.other_origin TARGET RUN_ID``: prints its port, then serves until killed.
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

SCRIPT = """
window.results = [];
fetch(TARGET + "/api/runs", {credentials: "include"}).then(r => r.text())
  .then(t => results.push("read:" + t.length)).catch(e => results.push("read refused"));
fetch(TARGET + "/api/runs/" + RUN + "/stop", {method: "POST", credentials: "include",
  headers: {"X-Fsdpctl-Csrf": "guess"}}).then(r => results.push("post:" + r.status))
  .catch(e => results.push("post refused"));
fetch(TARGET + "/api/runs/" + RUN + "/stop", {method: "POST", mode: "no-cors", credentials: "include"})
  .then(r => results.push("simple post sent")).catch(e => results.push("simple post refused"));
"""


def main() -> None:
    target, run_id = sys.argv[1], sys.argv[2]
    page = (f"<!doctype html><body><script>const TARGET = {json.dumps(target)}; const RUN = {json.dumps(run_id)};"
            f"{SCRIPT}</script></body>").encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            return None

    server = HTTPServer(("127.0.0.2", 0), Page)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
