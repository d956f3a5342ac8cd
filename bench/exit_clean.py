"""Does a finished user script exit 0, every time? Unchanged user scripts (tests/user_scripts: the
plain FSDP2 loop and the Hugging Face Trainer) launched again and again on two nodes of the namespace
testbed (two ranks each by default); every launch's exit code counted, and the runs whose rank died in Python's
shutdown ("terminate called without an active exception", SIGABRT or SIGSEGV after the last step).

  A: this tree (the start-up hook waits for torch's threads before the interpreter shuts down)
  B (baseline): the same with FSDPCTL_EXIT_SETTLE_S=0 in the profile's env (no wait: the launch as
     it was before)
Interleaved (A B A B ...). Run as root:
  .venv/bin/python bench/exit_clean.py [--runs 20] [--baseline-runs 10] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, fsdpctl_env, machine, start_lab  # noqa: E402

SCRIPTS = {"fsdp2 loop": "fsdp2_loop.py", "HF Trainer": "hf_trainer.py"}
CRASH_WORDS = ("terminate called without an active exception", "Fatal Python error")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="launches of each script with this tree")
    parser.add_argument("--baseline-runs", type=int, default=10, help="launches of each script without the wait")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nproc-per-node", type=int, default=2, help="ranks on each of the two nodes")
    args = parser.parse_args()
    root, lab = start_lab("exit_clean")
    try:
        code = root / "code"
        code.mkdir()
        for name in SCRIPTS.values():
            shutil.copy(REPO / "tests" / "user_scripts" / name, code / name)
        profiles = {}
        for case, extra in (("this tree", ""), ("no exit wait", "env:\n  FSDPCTL_EXIT_SETTLE_S: '0'\n")):
            path = root / f"{len(profiles)}.yaml"
            text = lab.profile_yaml(["n1", "n2"], python=sys.executable, name=f"p{len(profiles)}") + extra
            path.write_text(text.replace("nproc_per_node: 1\n", f"nproc_per_node: {args.nproc_per_node}\n"))
            profiles[case] = path
        env = fsdpctl_env(root)
        results: dict[str, list[dict]] = {}
        planned = [(case, script) for i in range(max(args.runs, args.baseline_runs))
                   for case in profiles for script in SCRIPTS
                   if i < (args.runs if case == "this tree" else args.baseline_runs)]
        for number, (case, script) in enumerate(planned, 1):
            started = time.perf_counter()
            done = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profiles[case]),
                                                 "--no-preflight", "--code", str(code), "--", SCRIPTS[script],
                                                 "--steps", str(args.steps)]),
                                  cwd=root, env=env, capture_output=True, text=True, timeout=600)
            output = done.stdout + done.stderr
            row = {"exit_code": done.returncode, "seconds": round(time.perf_counter() - started, 2),
                   "crash_in_shutdown": any(word in output for word in CRASH_WORDS),
                   "said_in_shutdown": "after its program had ended" in output}
            results.setdefault(f"{script}, {case}", []).append(row)
            print(f"[{number}/{len(planned)}] {script}, {case}: exit {row['exit_code']}"
                  f"{' (crash in shutdown)' if row['crash_in_shutdown'] else ''} in {row['seconds']} s", flush=True)
        summary = {}
        print(f"\n{'case':40s} {'runs':>5s} {'exit 0':>7s} {'crash at exit':>14s} {'said so':>8s} {'codes':>20s}")
        for name, rows in results.items():
            codes = Counter(r["exit_code"] for r in rows)
            summary[name] = {"runs": len(rows), "exit_0": codes[0],
                             "crashed_in_shutdown": sum(r["crash_in_shutdown"] for r in rows),
                             "said_so": sum(r["said_in_shutdown"] for r in rows),
                             "codes": dict(codes), "first_non_zero": next((i + 1 for i, r in enumerate(rows)
                                                                           if r["exit_code"]), None)}
            row = summary[name]
            print(f"{name:40s} {row['runs']:5d} {row['exit_0']:7d} {row['crashed_in_shutdown']:14d} "
                  f"{row['said_so']:8d} {json.dumps(row['codes']):>20s}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "exit_clean.json").write_text(json.dumps(
            {"benchmark": "exit_clean", "baseline": "no exit wait", "cases": summary, "runs": results,
             "steps": args.steps, "nproc_per_node": args.nproc_per_node, "machine": machine()}, indent=2) + "\n")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
