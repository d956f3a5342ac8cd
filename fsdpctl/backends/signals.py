"""The signals that stop a launcher (SIGINT, SIGTERM, SIGHUP), taken over while it follows a run."""

from __future__ import annotations

import signal
import threading
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """The launcher was told to stop (SIGINT, SIGTERM, SIGHUP). Not an Exception, as KeyboardInterrupt is
    not: the handler raises it wherever the main thread is, and the guards around a live view's work
    there (``except Exception``: a view never stops a run) must not take a stop for a view's failure."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def on_stop_signals(handler) -> dict[int, Any]:
    """Install ``handler`` for SIGINT, SIGTERM and SIGHUP (in the main thread only); the previous ones."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in STOP_SIGNALS}


def raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers ``on_stop_signals`` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
