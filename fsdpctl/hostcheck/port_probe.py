"""The probe's rendezvous-port check (appended to the probe's source): the master holds the port open
until the other nodes connected, the others connect to it, both within a window. Standard library
only, Python 3.8+, like the probe.

It runs beside the rest of the probe (``PortCheck``, a thread started first), and its window lasts
at least as long as the probe's own facts take: a node whose facts are slow (torch imported on a
loaded host took 15 s in a parallel test session) no longer listens after the others gave up.
"""

import json
import socket
import struct
import threading
import time

PORT_WORD = "port"
"""launcher -> node, in a port round: ``port <json>`` (``{"listen": ...}`` or ``{"connect": ...}``)."""
PORT_OVER = "over"
"""launcher -> the master, in a port round: every other node has tried; stop listening."""
PORT_READY = "<<<FSDPCTL-PORT-READY>>>"
"""the master -> launcher: ``<marker> listening`` once it listens (then the others are started), or
``<marker> not-listening`` (its port is taken: its answer follows at once, no ``over`` is awaited)."""


class PortCheck:
    """``listen`` or ``connect`` in a thread from now, for at least its window and for as long as
    the caller is still collecting (until ``finish``)."""

    def __init__(self, args, on_listening=None):
        self.done = threading.Event()
        self.found = {}
        kind = "listen" if args.get("listen") else "connect"
        spec = args[kind]

        def run():
            busy = lambda: not self.done.is_set()  # noqa: E731
            self.found[kind] = (listen(spec, busy, on_listening) if kind == "listen" else connect(spec, busy))

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def finish(self):
        """The check's result (``{"listen": ...}`` or ``{"connect": ...}``), once it is over."""
        self.done.set()
        self.thread.join()
        return self.found


def listen(spec, busy=lambda: False, on_listening=None):
    """On the master: bind the rendezvous port (is it free?) and accept the other nodes' connects,
    within the window or while ``busy()``; ``on_listening()`` once the port is bound and listening."""
    result = {"port": spec["port"], "free": False, "peers": []}
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((spec.get("addr") or "0.0.0.0", spec["port"]))
    except OSError as exc:
        result["error"] = exc.strerror or str(exc)
        server.close()
        return result
    result["free"] = True
    server.listen(64)
    if on_listening is not None:
        on_listening()
    deadline = time.time() + spec["window"]
    while len(result["peers"]) < spec["expect"] and (time.time() < deadline or busy()):
        left = deadline - time.time()
        server.settimeout(max(0.01, min(0.2, left)) if left > 0 else 0.2)  # past the window: while busy()
        try:
            conn, addr = server.accept()
        except socket.timeout:
            continue
        result["peers"].append(addr[0])
        # Let the peer close first, then reset: no TIME_WAIT may stay on the rendezvous port, or
        # torchrun could not bind its store there a moment later.
        conn.settimeout(1.0)
        try:
            conn.recv(1)
        except (socket.timeout, OSError):
            pass
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    server.close()
    return result


def connect(spec, busy=lambda: False):
    """On the others: connect to the master's port, retrying until the master's probe listens
    (within the window or while ``busy()``)."""
    deadline = time.time() + spec["window"]
    last = None
    while time.time() < deadline or busy():
        try:
            conn = socket.create_connection((spec["addr"], spec["port"]), timeout=max(1.0, deadline - time.time()))
            conn.close()
            return {"addr": spec["addr"], "port": spec["port"], "reached": True}
        except OSError as exc:
            last = exc.strerror or str(exc)
            time.sleep(0.05)
    return {"addr": spec["addr"], "port": spec["port"], "reached": False, "error": last or "timed out"}


def answer_port(asked, wait_over, say):
    """One node's part of a port round, once every probe has answered: the master listens (and says
    so) until ``wait_over()`` returns, the launcher's word that the others have tried; the others
    connect. The answer, as the probe gives it (``{"listen": ...}`` or ``{"connect": ...}``)."""
    if not asked.get("listen"):
        return {"connect": connect(asked["connect"])}
    listening = threading.Event()
    check = PortCheck({"listen": asked["listen"]}, on_listening=listening.set)
    while not listening.is_set() and check.thread.is_alive():
        listening.wait(0.05)
    say("%s %s" % (PORT_READY, "listening" if listening.is_set() else "not-listening"))
    if listening.is_set():
        wait_over()
    return check.finish()


def port_round_request(asked):
    """The line that asks a node for its part of a port round."""
    return "%s %s\n" % (PORT_WORD, json.dumps(asked, sort_keys=True))
