"""The probe's rendezvous-port check (appended to the probe's source): the master holds the port open
until the other nodes connected, the others connect to it, both within a window. Standard library
only, Python 3.8+, like the probe.
"""

import socket
import struct
import time


def listen(spec):
    """On the master: bind the rendezvous port (is it free?) and accept the other nodes' connects."""
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
    deadline = time.time() + spec["window"]
    while len(result["peers"]) < spec["expect"] and time.time() < deadline:
        server.settimeout(max(0.01, deadline - time.time()))
        try:
            conn, addr = server.accept()
        except socket.timeout:
            break
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


def connect(spec):
    """On the others: connect to the master's port, retrying until the master's probe listens."""
    deadline = time.time() + spec["window"]
    last = None
    while time.time() < deadline:
        try:
            conn = socket.create_connection((spec["addr"], spec["port"]), timeout=max(0.1, deadline - time.time()))
            conn.close()
            return {"addr": spec["addr"], "port": spec["port"], "reached": True}
        except OSError as exc:
            last = exc.strerror or str(exc)
            time.sleep(0.05)
    return {"addr": spec["addr"], "port": spec["port"], "reached": False, "error": last or "timed out"}
