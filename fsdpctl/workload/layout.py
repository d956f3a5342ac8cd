"""Where a run directory keeps its checkpoints, and which of them are complete.

Standard library only: the launcher reads this to find the step a run can resume from (locally, on
a shared Slurm directory, or as a shell test on a node) without importing torch.
"""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINTS = "checkpoints"
STEP_DIR = re.compile(r"^step_(\d{7})$")
COMPLETE_MARKERS = (".metadata", "trainer_state.json")
"""A checkpoint directory holding both is complete (DCP's metadata, then the trainer's state, written last)."""


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint directories under ``root`` (a run's ``checkpoints/``), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and all((p / m).is_file() for m in COMPLETE_MARKERS)]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))  # type: ignore[union-attr]


def complete_steps(run_dir: Path) -> list[int]:
    """The steps of a run directory's complete checkpoints, oldest first."""
    return [int(STEP_DIR.match(p.name).group(1)) for p in complete_checkpoints(run_dir / CHECKPOINTS)]  # type: ignore[union-attr]


def complete_steps_command(run_dir_quoted: str) -> str:
    """A shell command printing the same steps, one per line, run on a node (``run_dir_quoted``:
    the run directory as a shell word)."""
    tests = " && ".join(f'[ -f "$d/{marker}" ]' for marker in COMPLETE_MARKERS)
    return (f"cd {run_dir_quoted} 2>/dev/null && for d in {CHECKPOINTS}/step_[0-9][0-9][0-9][0-9][0-9][0-9][0-9]; "
            f'do {tests} && echo "${{d#{CHECKPOINTS}/step_}}"; done; true')


def parse_steps(text: str) -> list[int]:
    """The output of ``complete_steps_command`` as sorted steps."""
    return sorted(int(word) for word in text.split() if word.isdigit())
