"""The start-up hook's wrappers on a program's checkpoints and evaluations, installed by
``sitecustomize`` as the program imports them: ``torch.distributed.checkpoint``'s ``save``,
``async_save``, ``load``, and ``get_state_dict`` / ``set_state_dict`` of its ``state_dict`` module; the
Hugging Face Trainer's ``_save_checkpoint``, ``_load_from_checkpoint`` and ``evaluate``. On rank 0 each
call that returns writes an event row (``fsdpctl.node.events``): the launcher grows an elastic run back
at a save, and the goodput account counts what saves, loads and evaluations blocked. An async save's
future says when its write ended and how long the program waited on it. On every rank the collectives
inside them are no step's. Standard library only; the calls' results and exceptions are the program's,
unchanged.
"""

from __future__ import annotations

import functools
import os
import sys
import time

from .events import (
    CHECKPOINT_LOADED,
    CHECKPOINT_SAVED,
    CHECKPOINT_STAGED,
    CHECKPOINT_WAIT,
    EVALUATION,
    append_line,
    event_line,
)

_CHECKPOINT_CALLS = {"save": (CHECKPOINT_SAVED, "save"), "async_save": (CHECKPOINT_STAGED, "save"),
                     "load": (CHECKPOINT_LOADED, "load"), "get_state_dict": ("checkpoint_state", "save"),
                     "set_state_dict": ("checkpoint_state", "load")}
"""``torch.distributed.checkpoint``'s calls the hook times: (the event said on rank 0, which side of a
checkpoint it is). ``get_state_dict`` and ``set_state_dict`` live in its ``state_dict`` module."""
_TRAINER_CALLS = {"_save_checkpoint": (CHECKPOINT_SAVED, "save"), "_load_from_checkpoint": (CHECKPOINT_LOADED, "load"),
                  "evaluate": (EVALUATION, None)}
"""The Hugging Face Trainer's methods the hook times (``transformers.trainer.Trainer``): its saves write
with ``torch.save`` and safetensors, which no DCP wrapper sees; a DCP call inside them is theirs."""


def wrap(module, say_off):
    """Wrap the checkpoint calls ``module`` has: on rank 0, each that returns writes its event row
    (``fsdpctl.node.events``: when it began, its seconds; the launcher grows an elastic run back at a
    save, and counts a save's and a load's time in the goodput account); on every rank, the
    collectives inside them are no step's. The calls' results and exceptions are the program's,
    unchanged; a call inside another of them is the outer one's."""
    for name, (event, side) in _CHECKPOINT_CALLS.items():
        original = module.__dict__.get(name)
        if original is not None and callable(original) and not getattr(original, "fsdpctl_times", False):
            setattr(module, name, _timed(original, name, event, side, say_off, "dcp"))


def wrap_trainer(module, say_off):
    """Wrap ``transformers.trainer.Trainer``'s save, load and evaluation as ``wrap`` does DCP's (a
    subclass that overrides one and calls ``super()`` reaches the wrapper; one that does not call it
    is not seen)."""
    trainer = module.__dict__.get("Trainer")
    if not isinstance(trainer, type):
        return
    for name, (event, side) in _TRAINER_CALLS.items():
        original = trainer.__dict__.get(name)
        if original is not None and callable(original) and not getattr(original, "fsdpctl_times", False):
            setattr(trainer, name, _timed(original, name, event, side, say_off, "hf"))


def _timed(original, name, event, side, say_off, by):
    @functools.wraps(original)
    def timed(*args, **kwargs):
        if _INSIDE:
            return original(*args, **kwargs)
        began, mark = time.time(), _comm_mark()
        _INSIDE.append(name)
        try:
            result = original(*args, **kwargs)
        finally:
            _INSIDE.pop()
            _comm_back(mark)
        fields = _fields(name, event, side, by, began, time.time() - began, args)
        if fields is not None:
            _say(event, fields, say_off)
            if event == CHECKPOINT_STAGED:
                _follow_async(result, fields, say_off)
        return result

    timed.fsdpctl_times = True
    return timed


_INSIDE = []
"""The timed call this rank is inside (its training thread's: a program saves from it)."""
_SAVES_OFF = []
"""Set once writing a row failed: said once, not tried again."""


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


def _fields(name, event, side, by, began, seconds, args):
    """The row's fields of a call that returned, on rank 0 (None: another rank, or rows are off)."""
    if _SAVES_OFF or os.environ.get("RANK", "0") != "0":
        return None
    try:
        tracker = _tracker()
        fields = {"by": by if event in (CHECKPOINT_SAVED, CHECKPOINT_STAGED, EVALUATION) else name, "call": name,
                  "rank": 0, "began": round(began, 3), "seconds": round(seconds, 4),
                  "steps": tracker.number if tracker is not None else None}
        if event in (CHECKPOINT_SAVED, CHECKPOINT_STAGED):
            fields["step"] = None
        if event == "checkpoint_state":
            fields["side"] = side
        if by == "hf" and args:  # the Trainer's own count of optimizer steps, for people
            global_step = getattr(getattr(args[0], "state", None), "global_step", None)
            if isinstance(global_step, int):
                fields["global_step"] = global_step
        return fields
    except Exception:  # noqa: BLE001 - the program's call returned: nothing of ours may undo that
        return None


def _say(event, fields, say_off):
    """Append an event row to this node's telemetry, fail open: whatever goes wrong is one line on
    stderr, once, and never reaches the program."""
    if _SAVES_OFF:
        return
    try:
        from .telemetry import rows_path

        node = os.environ.get("FSDPCTL_NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
        append_line(rows_path(os.environ["FSDPCTL_RUN_DIR"], node), event_line(event, **fields))
    except Exception as exc:  # noqa: BLE001 - the program's call returned: nothing of ours may undo that
        _SAVES_OFF.append(True)
        say_off("for checkpoint saves", exc)


def _is_future(value):
    return callable(getattr(value, "add_done_callback", None)) and callable(getattr(value, "result", None))


def _follow_async(result, staged, say_off):
    """An async save's future (or the ``upload_completion`` of torch's ``AsyncSaveResponse``): its write's
    end becomes a ``CHECKPOINT_SAVED`` row (``written``), and every ``result()`` the program blocks on a
    ``CHECKPOINT_WAIT`` row. The future stays the program's object: its ``result`` is timed on the
    instance, its class untouched."""
    try:
        futures = [f for f in (result, getattr(result, "staging_completion", None),
                               getattr(result, "upload_completion", None)) if _is_future(f)]
        for future in futures:
            future.result = _timed_wait(future.result, say_off)
        upload = result if _is_future(result) else getattr(result, "upload_completion", None)
        if _is_future(upload):
            upload.add_done_callback(functools.partial(_written, staged=staged, say_off=say_off))
    except Exception as exc:  # noqa: BLE001 - the save is the program's: it goes on unwatched
        _SAVES_OFF.append(True)
        say_off("for async checkpoint saves", exc)


def _timed_wait(result, say_off):
    @functools.wraps(result)
    def waited(*args, **kwargs):
        if _INSIDE:  # torch's own wait inside another save: that call's time
            return result(*args, **kwargs)
        began = time.time()
        try:
            return result(*args, **kwargs)
        finally:
            seconds = time.time() - began
            if seconds >= 0.001:
                _say(CHECKPOINT_WAIT, {"by": "dcp", "rank": 0, "began": round(began, 3),
                                       "seconds": round(seconds, 4)}, say_off)

    return waited


def _written(future, staged, say_off):
    """The write behind an async save ended (run by the future's thread): a complete checkpoint, when
    it ended without an error."""
    try:
        if future.cancelled() or future.exception() is not None:
            return
        seconds = time.time() - staged["began"]
        _say(CHECKPOINT_SAVED, {**staged, "seconds": round(seconds, 4), "async": True, "written": True,
                                "call_s": staged["seconds"]}, say_off)
    except Exception as exc:  # noqa: BLE001 - the future's thread is torch's
        _SAVES_OFF.append(True)
        say_off("for async checkpoint saves", exc)
