"""The start-up hook's wrappers on ``torch.distributed.checkpoint``'s calls (``save``, ``async_save``,
``load``, and ``get_state_dict`` / ``set_state_dict`` of its ``state_dict`` module), installed by
``sitecustomize`` as the program imports them. On rank 0 each call that returns writes an event row
(``fsdpctl.node.events``): the launcher grows an elastic run back at a save, and the goodput account
counts what saves and loads blocked. On every rank the collectives inside them are no step's. Standard
library only; the calls' results and exceptions are the program's, unchanged.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from .events import append_line, event_line

_CHECKPOINT_CALLS = {"save": ("checkpoint_saved", "save"), "async_save": ("checkpoint_saved", "save"),
                     "load": ("checkpoint_loaded", "load"), "get_state_dict": ("checkpoint_state", "save"),
                     "set_state_dict": ("checkpoint_state", "load")}
"""``torch.distributed.checkpoint``'s calls the hook times: (the event said on rank 0, which side of a
checkpoint it is). ``get_state_dict`` and ``set_state_dict`` live in its ``state_dict`` module."""


def wrap(module, say_off):
    """Wrap the checkpoint calls ``module`` has: on rank 0, each that returns writes its event row
    (``fsdpctl.node.events``: when it began, its seconds; the launcher grows an elastic run back at a
    save, and counts a save's and a load's time in the goodput account); on every rank, the
    collectives inside them are no step's. The calls' results and exceptions are the program's,
    unchanged; a call inside another of them is the outer one's."""
    for name, (event, side) in _CHECKPOINT_CALLS.items():
        original = module.__dict__.get(name)
        if original is not None and callable(original) and not getattr(original, "fsdpctl_times", False):
            setattr(module, name, _timed(original, name, event, side, say_off))


def _timed(original, name, event, side, say_off):
    @functools.wraps(original)
    def timed(*args, **kwargs):
        if _IN_CHECKPOINT:
            return original(*args, **kwargs)
        began, mark = time.time(), _comm_mark()
        _IN_CHECKPOINT.append(name)
        try:
            result = original(*args, **kwargs)
        finally:
            _IN_CHECKPOINT.pop()
            _comm_back(mark)
        _checkpointed(name, event, side, began, time.time() - began, say_off)
        return result

    timed.fsdpctl_times = True
    return timed


_IN_CHECKPOINT = []
"""The checkpoint call this rank is inside (its training thread's: a program saves from it)."""
_SAVES_OFF = []
"""Set once writing a checkpoint's row failed: said once, not tried again."""


def _tracker():
    """This rank's step tracker, where the telemetry is on (None: off, or not installed yet)."""
    telemetry = sys.modules.get("fsdpctl.node.telemetry")
    installed = getattr(telemetry, "INSTALLED", None)
    return installed[0].tracker if installed else None


def _comm_mark():
    try:
        tracker = _tracker()
        return (tracker, tracker.comm_s) if tracker is not None else None
    except Exception:  # noqa: BLE001 - fail open: the call is the program's
        return None


def _comm_back(mark):
    """A checkpoint call's collectives are the checkpoint's time, not the step's collective wait."""
    if mark is not None:
        mark[0].comm_s = mark[1]


def _checkpointed(name, event, side, began, seconds, say_off):
    """The row of a checkpoint call that returned, on rank 0, fail open: whatever goes wrong is one
    line on stderr, once, and never reaches the program."""
    if _SAVES_OFF or os.environ.get("RANK", "0") != "0":
        return
    try:
        from .telemetry import rows_path

        tracker = _tracker()
        fields = {"by": "dcp" if event == "checkpoint_saved" else name, "call": name, "rank": 0,
                  "began": round(began, 3), "seconds": round(seconds, 4),
                  "steps": tracker.number if tracker is not None else None}
        if event == "checkpoint_saved":
            fields["step"] = None
            fields["async"] = name == "async_save"
        elif event == "checkpoint_state":
            fields["side"] = side
        node = os.environ.get("FSDPCTL_NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
        append_line(rows_path(os.environ["FSDPCTL_RUN_DIR"], node), event_line(event, **fields))
    except Exception as exc:  # noqa: BLE001 - the program's call returned: nothing of ours may undo that
        _SAVES_OFF.append(True)
        say_off("for checkpoint saves", exc)
