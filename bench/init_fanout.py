"""`fsdpctl init` against `fsdpctl doctor` on the same hosts of the namespace testbed, at 1, 8 and 32
hosts (goal: init within 1.2x of doctor). Both are whole commands run from the client namespace
(interleaved repeats, medians); init also asks each host for its route to the master, NCCL's default
interface, net plugins, and writes the profile.

Run as root: .venv/bin/python bench/init_fanout.py [--sizes 1,8,32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, fsdpctl_env, interleaved, machine, summarize  # noqa: E402

from tests.testbed.lab import Lab, netns_available  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reason = netns_available()
    if reason:
        sys.exit(f"init_fanout: the namespace testbed {reason}")
    sizes = [int(s) for s in args.sizes.split(",")]
    names = [f"n{i}" for i in range(1, max(sizes) + 1)]
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-init-"))
    lab = Lab(root, names).up()
    results = {}
    try:
        for name in names:
            lab.start_sshd(name)
        env = fsdpctl_env(root)

        def timed(argv: list[str]) -> float:
            started = time.perf_counter()
            done = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", *argv]), env=env, cwd=root,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{argv[0]} failed: {done.stderr[-2000:]}")
            return time.perf_counter() - started

        for size in sizes:
            chosen = names[:size]
            profile = root / f"bench{size}.yaml"
            profile.write_text(lab.profile_yaml(chosen, python=sys.executable, name=f"bench{size}"))
            init = ["init", f"init{size}", *(lab.hosts[n].address for n in chosen), "--python", sys.executable,
                    "--user", "root", "--identity-file", str(lab.client_key), "--known-hosts", str(lab.known_hosts),
                    "--force", "-o", str(root / f"init{size}.yaml")]
            samples = interleaved({"fsdpctl doctor": lambda p=profile: timed(["doctor", "-p", str(p)]),
                                   "fsdpctl init": lambda a=init: timed(a)}, repeats=args.repeats)
            summary = summarize(samples, "fsdpctl doctor")
            results[str(size)] = summary
            doctor, ours = summary["fsdpctl doctor"], summary["fsdpctl init"]
            print(f"{size:3d} host(s): doctor {doctor['median_s']:.2f} s, init {ours['median_s']:.2f} s, "
                  f"ratio {ours['ratio_to_baseline']:.3f}")
    finally:
        lab.down()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "init_fanout.json").write_text(json.dumps(
        {"benchmark": "init_fanout", "baseline": "fsdpctl doctor", "sizes": results, "machine": machine(),
         "goal": "init within 1.2x of doctor on the same hosts"}, indent=2) + "\n")


if __name__ == "__main__":
    main()
