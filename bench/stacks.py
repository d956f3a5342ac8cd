"""Every rank's stack on the 2-host namespace testbed, against the same typed by hand.

  A: `fsdpctl stacks RUN` from the client namespace (the whole command: start-up, one SSH command
     per node, py-spy on every rank of a node at once, grouping)
  B (baseline): `ssh HOST py-spy dump --pid P`, one per rank, all started at once
  C: `fsdpctl stacks RUN --native` (C/C++ frames too), for information
Run 1: 2 nodes x 2 ranks of a user's FSDP2 job hung on rank 3 (ranks 0-2 wait in a gloo all-gather).
Run 2: 2 nodes x 16 ranks (32) of a stand-in Python program (no torch: 32 torch ranks do not fit
two cores), for how the command scales with ranks. Interleaved A B C A B C.
Goal: A/B <= 1.5 for 4 ranks. Run as root: .venv/bin/python bench/stacks.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, start_lab, summarize  # noqa: E402

from fsdpctl.node.stacks import find_ranks  # noqa: E402
from tests.integration.user_project import write_project  # noqa: E402

IDLE = "import time\n\n\ndef idle_forever():\n    time.sleep(3600)\n\n\nprint('idle', flush=True)\nidle_forever()\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root, lab = start_lab("stacks")
    env = {**os.environ, "HOME": str(root), "FSDPCTL_RUNS_DIR": str(root / "runs"), "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    fsdpctl = [sys.executable, "-m", "fsdpctl"]
    py_spy = str(Path(sys.executable).parent / "py-spy")
    try:
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable))
        project = write_project(root / "project")
        idle = root / "idle"
        idle.mkdir()
        (idle / "idle.py").write_text(IDLE)

        def detached(nproc: int, *job: str, ranks: int) -> str:
            done = subprocess.run(lab.in_client([*fsdpctl, "launch", "-p", str(profile), "--detach",
                                                 "--nproc-per-node", str(nproc), *job]),
                                  env=env, capture_output=True, text=True, check=True)
            run_id = done.stdout.strip()
            deadline = time.monotonic() + 300
            while len(find_ranks(run_id)) < ranks and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(15)  # past start-up: every rank at the place it stays
            return run_id

        def by_fsdpctl(run_id: str, *extra: str) -> float:
            started = time.perf_counter()
            subprocess.run(lab.in_client([*fsdpctl, "stacks", run_id, *extra]), env=env, check=True,
                           capture_output=True)
            return time.perf_counter() - started

        def by_hand(run_id: str) -> float:
            ranks = find_ranks(run_id)
            started = time.perf_counter()
            ssh = ["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes", "-o",
                   f"UserKnownHostsFile={lab.known_hosts}"]
            host = {"0": lab.hosts["n1"].address, "1": lab.hosts["n2"].address}
            dumps = [subprocess.Popen(lab.in_client([*ssh, f"root@{host[environ['FSDPCTL_NODE_RANK']]}",
                                                     f"{py_spy} dump --pid {pid}"]),
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for pid, environ in ranks.items()]
            if any(p.wait() for p in dumps):
                raise SystemExit("a hand-typed py-spy dump failed")
            return time.perf_counter() - started

        results = {}
        for label, nproc, job, ranks in (
                ("4 ranks", 2, ["--code", str(project), "--env", "STEPS=1000", "--env", "HANG_RANK=3", "--",
                                "train.py"], 4),
                ("32 ranks", 16, ["--code", str(idle), "--", "idle.py"], 32)):
            run_id = detached(nproc, *job, ranks=ranks)
            try:
                samples = interleaved({"fsdpctl stacks": lambda run_id=run_id: by_fsdpctl(run_id),
                                       "ssh host py-spy dump --pid P, all at once":
                                           lambda run_id=run_id: by_hand(run_id),
                                       "fsdpctl stacks --native": lambda run_id=run_id: by_fsdpctl(run_id, "--native")},
                                      repeats=args.repeats, warmup=1)
            finally:
                subprocess.run(lab.in_client([*fsdpctl, "stop", run_id]), env=env, capture_output=True)
            results[label] = summarize(samples, "ssh host py-spy dump --pid P, all at once")
        for label, summary in results.items():
            report(f"stacks_{label.replace(' ', '_')}", "ssh host py-spy dump --pid P, all at once", summary,
                   {"goal": "fsdpctl stacks ratio <= 1.5 (4 ranks)", "ranks": int(label.split()[0]), "nodes": 2})
    finally:
        lab.down()


if __name__ == "__main__":
    main()
