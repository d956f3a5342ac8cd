"""A run's attempts: planning the next one from the same inputs, keeping the last one's files apart,
and deciding whether a failed one is started again.

An attempt is one start of a run. ``launch --resume RUN`` and ``--max-restarts`` start attempt N+1 in
the same run directory (here and on the nodes) with the plan the run was made from, so the bundled
workload continues from its newest complete checkpoint and a user's program finds its own files
(``FSDPCTL_RUN_DIR``, ``FSDPCTL_ATTEMPT``). What attempt N left (its plan, scripts and logs; on the
nodes each node's log, exit and pid files and torchrun's log folder) moves to ``attempts/<N>/``; the
newest attempt's files keep their usual names, so every reader works on it unchanged.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from ..errors import UsageError
from ..plan.types import LaunchPlan
from .paths import private_dir
from .record import now
from .rundir import RunDir, write_attempt_files
from .state import RunState

ATTEMPTS = "attempts"


def attempt_folder(attempt: int) -> str:
    """Where attempt ``attempt``'s files go once a later attempt starts (relative to a run directory)."""
    return f"{ATTEMPTS}/{attempt}"


def node_files(rank: int) -> tuple[str, ...]:
    """What one node's part of an attempt leaves in the run directory on the node: its own files, and
    the ranks' stack and flight-recorder dumps (a shared run directory's are moved by whichever node
    comes first)."""
    return (f"node{rank}.log", f"node{rank}.exit", f"node{rank}.pid", f"logs/node{rank}", "stacks", "flight",
            f"telemetry/node{rank}.jsonl")


def move_into(root: Path, names: tuple[str, ...], folder: str) -> None:
    """Move each of ``names`` (relative to ``root``) that exists into ``root/folder``, keeping its path."""
    for name in names:
        source = root / name
        if source.exists() or source.is_symlink():
            target = root / folder / name
            private_dir(target.parent)
            try:
                shutil.move(str(source), str(target))
            except FileNotFoundError:
                pass  # another node sharing the directory moved it first


def begin_attempt(run: RunDir, plan: LaunchPlan, scripts: dict[str, str], from_step: Optional[int]) -> RunDir:
    """Keep the last attempt's files in ``attempts/<N>/`` and its summary (its nodes included) in
    run.json's ``attempts``, then write the new attempt's plan and scripts; returns the run as it now is."""
    previous = run.plan.attempt
    root = run.root
    move_into(root, ("logs", "hang", "fetched", "flight"), attempt_folder(previous))
    private_dir(root / attempt_folder(previous))
    shutil.copy2(run.paths.plan, root / attempt_folder(previous) / "plan.json")
    move_into(root, ("scripts",), attempt_folder(previous))
    record = run.record.next_attempt(plan.attempt, from_step, now())
    write_attempt_files(run.paths, plan, scripts)
    following = RunDir(run.paths, plan, run.profile)
    following.begin(record.replace(num_nodes=plan.num_nodes, world_size=plan.world_size))
    return following


def check_resumable(run: RunDir, state: RunState, steps: list[int], new_total: Optional[int]) -> Optional[int]:
    """Refuse (UsageError, one line) a run that cannot take another attempt; the step it continues
    from (None for a program of the user's, whose own files say where it stands)."""
    rid = run.run_id
    if not state.is_over:
        raise UsageError(f"run {rid}: is still {state}", f"end it first (`fsdpctl stop {rid}`), or follow it "
                         f"(`fsdpctl logs -f {rid}`)")
    if run.plan.command:
        return None
    if not steps:
        every = run.plan.train.get("checkpoint_interval") or 0
        saves = f"every {every} steps" if every else "only at the end (checkpoint_interval is 0)"
        raise UsageError(f"run {rid}: has no complete checkpoint in {run.plan.run_dir}/checkpoints (it saves one "
                         f"{saves})", "start it afresh with `fsdpctl launch`; --set checkpoint_interval=N saves "
                         "every N steps")
    total = new_total if new_total is not None else run.plan.train.get("steps")
    if isinstance(total, int) and total <= steps[-1]:
        raise UsageError(f"run {rid}: its newest checkpoint is at step {steps[-1]} of {total}: nothing left to train",
                         f"give --steps N (more than {steps[-1]}) to train on from it")
    return steps[-1]
