"""What a rank tells the launcher, as rows on the path the collector already carries (a node's
``metrics.jsonl`` for the bundled workload, its ``telemetry/node<R>.jsonl`` for the start-up hook in a
program of yours), never as printed lines: a line a program happens to print changes nothing.

An event row is a JSON object with ``EVENT`` naming the event, ``kind`` ``event`` (``metrics.jsonl``'s
other rows are ``train`` or ``val``: a script that picks its rows by ``kind`` keeps working), the
``time`` it happened (seconds since the epoch, on the node), the ``attempt`` it happened in
(``FSDPCTL_ATTEMPT``) and the event's own fields. The launcher's readers (``fsdpctl.live.copies``)
hand them to whoever asked. Standard library only: the workload, the start-up hook and the launcher
all import it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any, Optional

EVENT = "fsdpctl_event"
"""The key that makes a row an event (``metrics.jsonl``'s other rows have a ``step``)."""

CHECKPOINT_SAVED = "checkpoint_saved"
"""A checkpoint is complete on storage: ``step`` (the bundled workload's, None for a program's DCP save),
``by`` (``workload``; ``dcp``: ``torch.distributed.checkpoint.save`` returned on rank 0 of a program,
which then says its ``rank``; ``hf``: the Hugging Face Trainer's ``_save_checkpoint`` returned), ``began``
and ``seconds`` (what the save blocked the ranks), ``steps`` (a program's steps the hook counted by then,
this attempt). After an ``async_save``, ``async`` and ``written`` are true: its write behind the steps
ended, ``seconds`` after the call's ``began`` (the call's own blocking part is ``CHECKPOINT_STAGED``).
An elastic run short of nodes grows back at it."""
CHECKPOINT_STAGED = "checkpoint_staged"
"""``torch.distributed.checkpoint.async_save`` returned on rank 0: ``began`` and ``seconds`` it blocked the
ranks (staging the state); the write goes on behind the steps (``CHECKPOINT_SAVED`` once it ends)."""
CHECKPOINT_WAIT = "checkpoint_wait"
"""Rank 0 of a program waited on an async save's future (its ``result()``): ``began``, ``seconds``."""
EVALUATION = "evaluation"
"""An evaluation between steps, on rank 0: ``began``, ``seconds``, ``by`` (``hf``: the Hugging Face
Trainer's ``evaluate``). The bundled workload says its own in its ``val`` rows (``eval_s``)."""
BATCH_SPLIT = "batch_split"
"""How the bundled workload of an elastic run trains the run's global batch on this attempt's ranks,
written as each attempt starts (at the full size too: the launcher plans a shrink's split from it; on
fewer ranks it keeps the global batch): ``world``, ``full`` (ranks), ``global_batch``, ``batch`` and
``accumulation`` per rank, and ``text`` (``global batch 24 kept: batch 8 x accumulation 3 per rank``)."""
CHECKPOINT_LOADED = "checkpoint_loaded"
"""A checkpoint was read back: ``began`` (seconds since the epoch) and ``seconds``, ``by`` (``workload``, or
``dcp``: ``torch.distributed.checkpoint.load`` or ``set_state_dict`` in a program, on its rank 0), ``step``
(the bundled workload's)."""
STEPS_BEGIN = "steps_begin"
"""The bundled workload's training loop begins (model built, checkpoint loaded): ``step`` it begins after."""
PROGRAM_EXIT = "program_exit"
"""A program of yours leaves (the start-up hook's exit handler, on rank 0): ``last_step_at`` (seconds since
the epoch; None: no step seen), ``steps`` seen."""
STEPS_UNSEEN = "steps_unseen"
"""The start-up hook saw a rank's backward calls but no optimizer step end (its step runs inside
``torch.compile``, or its optimizer is no ``torch.optim.Optimizer``): ``backward`` (calls seen)."""


def event_row(name: str, **fields: Any) -> dict[str, Any]:
    """An event row: ``name``, now, this process's attempt, and ``fields``."""
    return {EVENT: name, "kind": "event", "time": round(time.time(), 3),
            "attempt": int(os.environ.get("FSDPCTL_ATTEMPT", "1") or 1), **fields}


def event_line(name: str, **fields: Any) -> str:
    """``event_row`` as one line of JSON (with its newline)."""
    return json.dumps(event_row(name, **fields), separators=(",", ":")) + "\n"


def append_line(path: str, line: str) -> None:
    """Append ``line`` (one or more whole lines) to ``path`` in one write (every rank of a node appends
    to the same file: a line is never split by another's)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        view = memoryview(line.encode())
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def event_name(row: Mapping[str, Any]) -> Optional[str]:
    """The event a row is (None: a row of figures)."""
    name = row.get(EVENT)
    return name if isinstance(name, str) else None
