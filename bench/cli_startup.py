"""CLI and API start-up: `fsdpctl --help` and `import fsdpctl` against `python -c "import torch"`
(goal: ratio <= 0.1 for both), with `python -c pass` as the interpreter's own floor; and a completion
(every Tab press is a new `fsdpctl` process: goal < 0.3 s).

Neither the CLI nor the API imports torch; this measures what a user waits for on every command,
and what a notebook pays to `import fsdpctl` (and to reach its launch function).
Run: .venv/bin/python bench/cli_startup.py [--repeats N]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, summarize, time_command  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    py = sys.executable
    cases = {
        "python -c 'import torch' (baseline)": lambda: time_command([py, "-c", "import torch"]),
        "fsdpctl --help": lambda: time_command([py, "-m", "fsdpctl", "--help"]),
        "fsdpctl launch -p two-node --dry-run": lambda: time_command(
            [py, "-m", "fsdpctl", "launch", "-p", "two-node", "--dry-run"]),
        "python -c 'import fsdpctl'": lambda: time_command([py, "-c", "import fsdpctl"]),
        "python -c 'import fsdpctl; fsdpctl.launch'": lambda: time_command(
            [py, "-c", "import fsdpctl; fsdpctl.launch"]),
        "python -c pass (interpreter floor)": lambda: time_command([py, "-c", "pass"]),
        "a Tab: fsdpctl launch -p <Tab> (bash completion)": lambda: time_command(
            [py, "-m", "fsdpctl"], env={**os.environ, "_FSDPCTL_COMPLETE": "complete_bash",
                                        "COMP_WORDS": "fsdpctl launch -p ", "COMP_CWORD": "3"}),
    }
    samples = interleaved(cases, repeats=args.repeats)
    report("cli_startup", "python -c 'import torch' (baseline)",
           summarize(samples, "python -c 'import torch' (baseline)"),
           {"goal": "fsdpctl --help and import fsdpctl ratios <= 0.1"})


if __name__ == "__main__":
    main()
