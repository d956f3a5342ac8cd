"""Log streaming on the namespace testbed: latency and throughput of fsdpctl's stream vs `ssh host tail -F`.

A stand-in for the node's Python prints numbered, time-stamped lines (first at a steady rate, then
as fast as it can). Two readers take the same node log at the same time from the client namespace:
  A: `fsdpctl launch` (its prefixed console stream)
  B (baseline): `ssh host tail -n +1 -F <node log>`
Per reader: p50/p99 latency of the paced lines (receive time - print time; one machine, one clock),
lines/s over the burst, and lines lost. Goals: p99 <= 1 s with no line lost; A p99 <= 1.5x B p99.
Run as root: .venv/bin/python bench/log_latency.py [--paced 2000] [--burst 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, machine  # noqa: E402

from tests.testbed.lab import Lab, netns_available  # noqa: E402

EMITTER = """\
#!{python}
import sys, time
paced, burst, rate = {paced}, {burst}, {rate}
time.sleep(1.0)  # let both readers attach
for i in range(paced):
    print(f"seq={{i}} t={{time.time():.6f}} paced", flush=True)
    time.sleep(1.0 / rate)
start = time.time()
for i in range(paced, paced + burst):
    sys.stdout.write(f"seq={{i}} t={{time.time():.6f}} burst\\n")
sys.stdout.flush()
print(f"done burst_seconds={{time.time() - start:.3f}}", flush=True)
"""
LINE = re.compile(r"seq=(\d+) t=([0-9.]+) (paced|burst)")


def read(process: subprocess.Popen, total: int, into: dict) -> None:
    """Record the receive time of every numbered line until the last one or the stream ends."""
    assert process.stdout is not None
    for raw in process.stdout:
        now = time.time()
        match = LINE.search(raw)
        if match:
            into[int(match.group(1))] = (float(match.group(2)), now, match.group(3))
            if int(match.group(1)) == total - 1:
                break


def stats(received: dict, total: int) -> dict:
    paced = sorted(now - sent for sent, now, kind in received.values() if kind == "paced")
    burst = sorted(now for _, now, kind in received.values() if kind == "burst")
    pick = (lambda q: paced[min(len(paced) - 1, int(q * len(paced)))]) if paced else (lambda q: float("nan"))
    return {"lines": len(received), "lost": total - len(received), "p50_s": pick(0.50), "p99_s": pick(0.99),
            "max_s": paced[-1] if paced else float("nan"),
            "burst_lines_per_s": (len(burst) - 1) / (burst[-1] - burst[0]) if len(burst) > 1 else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paced", type=int, default=2000, help="lines at a steady rate")
    parser.add_argument("--rate", type=int, default=400, help="lines per second while paced")
    parser.add_argument("--burst", type=int, default=50000, help="lines printed as fast as possible")
    args = parser.parse_args()
    reason = netns_available()
    if reason:
        sys.exit(f"log_latency: the namespace testbed {reason}")
    total = args.paced + args.burst
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-logs-"))
    lab = Lab(root, ["n1"]).up()
    try:
        lab.start_sshd("n1")
        emitter = root / "emitter"
        emitter.write_text(EMITTER.format(python=sys.executable, paced=args.paced, burst=args.burst, rate=args.rate))
        emitter.chmod(0o755)
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1"], python=str(emitter)))
        env = {**os.environ, "HOME": str(root), "FSDPCTL_RUNS_DIR": str(root / "runs"), "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)
        launcher = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile),
                                                   "--no-preflight"]),
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list((root / "work" / "runs").glob("*/node0.log")):
            time.sleep(0.02)
        node_log = next((root / "work" / "runs").glob("*/node0.log"))
        tail = subprocess.Popen(lab.in_client(["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes",
                                               "-o", f"UserKnownHostsFile={lab.known_hosts}",
                                               f"root@{lab.hosts['n1'].address}", f"tail -n +1 -F {node_log}"]),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        seen: dict[str, dict] = {"fsdpctl launch": {}, "ssh tail -F (baseline)": {}}
        readers = [threading.Thread(target=read, args=(p, total, seen[name]))
                   for p, name in ((launcher, "fsdpctl launch"), (tail, "ssh tail -F (baseline)"))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout=600)
        tail.kill()
        launcher.wait(timeout=60)
        results = {name: stats(received, total) for name, received in seen.items()}
        base = results["ssh tail -F (baseline)"]["p99_s"]
        for row in results.values():
            row["p99_ratio_to_baseline"] = row["p99_s"] / base if base else float("nan")
        print(f"\nlog_latency ({args.paced} paced lines at {args.rate}/s, then a burst of {args.burst})")
        print(f"{'reader':26s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'lost':>5s} {'burst lines/s':>14s} "
              f"{'p99 ratio':>9s}")
        for name, row in results.items():
            print(f"{name:26s} {row['p50_s'] * 1e3:8.1f} {row['p99_s'] * 1e3:8.1f} {row['max_s'] * 1e3:8.1f} "
                  f"{row['lost']:5d} {row['burst_lines_per_s']:14.0f} {row['p99_ratio_to_baseline']:9.2f}")
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "log_latency.json").write_text(json.dumps(
            {"benchmark": "log_latency", "baseline": "ssh tail -F (baseline)", "cases": results,
             "goal": "p99 <= 1 s, no line lost, p99 ratio <= 1.5", "machine": machine()}, indent=2) + "\n")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
