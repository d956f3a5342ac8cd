"""A webhook receiver for the notice tests: every POST's JSON body kept in order (in memory, and as a
line of ``out`` when given). In-process on loopback (``Receiver``), or inside a lab namespace as
``python -m tests.testbed.webhook ADDRESS PORT OUT`` (it prints ``listening`` once it is)."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional


class Receiver:
    """An HTTP server on ``address`` (port 0: any free one) that answers 200 to every POST."""

    def __init__(self, address: str = "127.0.0.1", port: int = 0, out: Optional[Path] = None):
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.out = out
        received = threading.Condition()
        self.received = received
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(data)
                except ValueError:
                    body = {"raw": data.decode("utf-8", "replace")}
                with received:
                    owner.bodies.append(body)
                    owner.paths.append(self.path)
                    if owner.out is not None:
                        with owner.out.open("a") as handle:
                            handle.write(json.dumps({"path": self.path, "body": body}) + "\n")
                    received.notify_all()
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The bodies, once at least ``count`` came (or ``timeout`` passed)."""
        with self.received:
            self.received.wait_for(lambda: len(self.bodies) >= count, timeout)
            return list(self.bodies)


if __name__ == "__main__":
    receiver = Receiver(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
    print("listening", flush=True)
    receiver.server.serve_forever()
