"""What a run's goodput account costs the process that counts it (``report``, ``status``, and every 30 s
the views and the exports of a live run): runs of 1 h, 6 h and 24 h at one window a second of 8 ranks
(the start-up hook's rows, with a checkpoint save every 10 minutes), the time to read the rows and to
divide every second, against the baseline of the same process parsing the same rows alone
(``json.loads`` of every line), measured in the same run.

Run: .venv/bin/python bench/goodput_account.py [--hours 1,6,24] [--ranks 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fsdpctl.accounting.account import account  # noqa: E402
from fsdpctl.accounting.facts import read_rows, run_facts  # noqa: E402
from fsdpctl.rundir.state import RunState  # noqa: E402


def write_rows(path: Path, hours: float, ranks: int, origin: float) -> int:
    """A node file of the hook's rows: every rank's window each second, a save every 600 s."""
    lines = 0
    with path.open("w") as out:
        for second in range(1, int(hours * 3600)):
            at = origin + 30.0 + second
            for rank in range(ranks):
                out.write(json.dumps({"step": second, "steps": 1, "kind": "train", "source": "hook", "rank": rank,
                                      "node": 0, "host": "n1", "local_rank": rank, "attempt": 1, "time": at,
                                      "wall_s": 1.0, "data_s": 0.01, "comm_s": 0.2, "compute_s": 0.79,
                                      "loss": 2.0, "backward_per_step": 1.0}) + "\n")
                lines += 1
            if second % 600 == 0:
                out.write(json.dumps({"fsdpctl_event": "checkpoint_saved", "kind": "event", "time": at + 2.0,
                                      "attempt": 1, "by": "dcp", "rank": 0, "step": None, "began": at,
                                      "seconds": 2.0, "steps": second}) + "\n")
                lines += 1
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", default="1,6,24")
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    print(f"{'run':>6} {'rows':>10} {'parse alone':>12} {'account':>10} {'ratio':>6} {'per hour':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for hours in (float(h) for h in args.hours.split(",")):
            origin = 1_800_000_000.0
            path = Path(folder) / "node0.jsonl"
            lines = write_rows(path, hours, args.ranks, origin)
            began = time.perf_counter()
            for line in path.read_text().splitlines():
                json.loads(line)
            baseline = time.perf_counter() - began
            end = origin + 30.0 + hours * 3600 + 5.0
            record = SimpleNamespace(attempt=1, attempts=(), started_at=None, finished_at=None,
                                     state=RunState.SUCCEEDED, from_step=None, replacements=(),
                                     timeline={"origin": origin, "phases": {"logs": {"0": [0.0, end - origin]}}})
            plan = SimpleNamespace(nproc_per_node=args.ranks, num_nodes=1, full_nodes=None, command=("train.py",))
            began = time.perf_counter()
            counted = account(run_facts(record, plan, Path(folder), read_rows([path])))
            took = time.perf_counter() - began
            assert counted.seconds["unattributed"] < 1.0, counted.seconds
            print(f"{hours:>5g}h {lines:>10,} {baseline:>11.2f}s {took:>9.2f}s {took / baseline:>5.2f}x "
                  f"{took / hours:>8.2f}s")


if __name__ == "__main__":
    main()
