"""torchrun's failure summary ("Root Cause (first observed failure)") as it stands in a node's log:
where the last one is, and the signal its failing rank died by. Standard library only: a Slurm job's
step helper reads it on a node, and the launcher's reader (``fsdpctl.backends.torchrun``) starts from
the same words.
"""

import re

SUMMARY = "Root Cause (first observed failure)"
EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
BLOCK_CHARS = 2000
"""How much text after its first line the summary takes, at most."""


def summary_block(text):
    """The last failure summary in ``text`` (None: torchrun printed none)."""
    cause = text.rfind(SUMMARY)
    return text[cause:cause + BLOCK_CHARS] if cause >= 0 else None


def summary_signal(text):
    """The signal the last summary says the rank died by (None: an exit code, or no summary)."""
    block = summary_block(text)
    match = EXITCODE.search(block) if block is not None else None
    code = int(match.group(1)) if match else 0
    return -code if code < 0 else None
