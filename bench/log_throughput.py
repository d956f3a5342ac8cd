"""Log throughput on the 2-host namespace testbed: 2 ranks x 200,000 lines of 70 bytes, printed as fast
as they can, to the launcher's terminal (a pipe this benchmark reads), against `ssh host cat` of the
same node logs afterwards, both hosts in parallel (baseline).

Figures, interleaved repeats, medians:
  stream: from the ranks' first line printed to the launcher's last line out (includes the print)
  print:  from the first line to the last one, as the ranks printed them (their own clocks: one machine)
  lag:    from the ranks' last line printed to the launcher's last line out (the backlog left)
  cat:    `ssh n1 cat node0.log & ssh n2 cat node1.log` (connection set-up included)
and the launcher's peak resident memory (its own /proc, sampled), with 200,000 and 20,000 lines per
rank (bounded: it must not grow with the volume). Every line is counted: none may be lost.
Run as root: .venv/bin/python bench/log_throughput.py [--lines 200000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, fsdpctl_env, machine, start_lab  # noqa: E402

PROGRAM = """\
import os, sys, time
rank, count, pad = int(os.environ["RANK"]), int(sys.argv[1]), "x" * 40
write = sys.stdout.write
write(f"BEGIN {time.time():.6f}\\n")
for i in range(count):
    write(f"flood rank={rank} seq={i:07d} {pad}\\n")
write(f"DONE {time.time():.6f}\\n")
sys.stdout.flush()
"""


def peak_rss(pid: int, stop: threading.Event, found: list[int]) -> None:
    """The highest VmHWM seen of ``pid`` and its children (the launcher runs in `ip netns exec`)."""
    while not stop.wait(0.1):
        for proc in [pid, *children(pid)]:
            try:
                for line in Path(f"/proc/{proc}/status").read_text().splitlines():
                    if line.startswith("VmHWM:") and b"fsdpctl" in Path(f"/proc/{proc}/cmdline").read_bytes():
                        found.append(int(line.split()[1]) * 1024)
            except OSError:
                continue


def children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [int(k) for k in kids] + [g for k in kids for g in children(int(k))]


def launch(lab, root: Path, profile: Path, code: Path, lines: int) -> dict:
    argv = lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile), "--code", str(code),
                          "--no-preflight", "--", "flood.py", str(lines)])
    process = subprocess.Popen(argv, env=fsdpctl_env(root), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    stop, rss = threading.Event(), []
    threading.Thread(target=peak_rss, args=(process.pid, stop, rss), daemon=True).start()
    begins, dones, counts, last = [], [], {0: 0, 1: 0}, 0.0
    assert process.stdout is not None
    for raw in process.stdout:
        text = raw.decode("utf-8", "replace")
        if " flood rank=" in text:
            counts[int(text.split("flood rank=")[1].split()[0])] += 1
            last = time.time()
        elif " BEGIN " in text:
            begins.append(float(text.rsplit(" ", 1)[1]))
        elif " DONE " in text:
            dones.append(float(text.rsplit(" ", 1)[1]))
            last = time.time()
    stop.set()
    if process.wait() != 0 or counts != {0: lines, 1: lines}:
        raise SystemExit(f"launch exited {process.returncode}; lines per rank {counts} of {lines}")
    return {"stream_s": last - min(begins), "print_s": max(dones) - min(begins), "lag_s": last - max(dones),
            "peak_rss_bytes": max(rss) if rss else None}


def cat_both(lab, root: Path) -> float:
    run_dir = sorted((root / "work" / "runs").iterdir())[-1]
    started = time.perf_counter()
    readers = [subprocess.Popen(lab.in_client(["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes", "-o",
                                               f"UserKnownHostsFile={lab.known_hosts}",
                                               f"root@{lab.hosts[name].address}", f"cat {run_dir}/node{rank}.log"]),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
               for rank, name in enumerate(["n1", "n2"])]
    sizes = [len(r.communicate()[0]) for r in readers]
    took = time.perf_counter() - started
    if min(sizes) < 70 * 1000:
        raise SystemExit(f"ssh cat read {sizes} bytes")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root, lab = start_lab("log_throughput")
    try:
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable))
        code = root / "code"
        code.mkdir()
        (code / "flood.py").write_text(PROGRAM)
        launch(lab, root, profile, code, 1000)  # warm-up
        runs, cats = [], []
        for _ in range(args.repeats):
            runs.append(launch(lab, root, profile, code, args.lines))
            cats.append(cat_both(lab, root))
        small = launch(lab, root, profile, code, args.lines // 10)
        med = {key: statistics.median(r[key] for r in runs) for key in ("stream_s", "print_s", "lag_s")}
        cat = statistics.median(cats)
        rss = max(r["peak_rss_bytes"] or 0 for r in runs)
        data = {"benchmark": "log_throughput", "lines_per_rank": args.lines, "ranks": 2, "runs": runs, "cat_s": cats,
                "median": {**med, "cat_s": cat}, "stream_over_cat": med["stream_s"] / cat,
                "lag_over_cat": med["lag_s"] / cat, "peak_rss_bytes": rss,
                "peak_rss_bytes_tenth_of_the_lines": small["peak_rss_bytes"], "machine": machine(),
                "goal": "every line; stream within 1.5x of ssh cat of the same files; bounded memory"}
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "log_throughput.json").write_text(json.dumps(data, indent=2) + "\n")
        print(json.dumps({k: v for k, v in data.items() if k not in ("runs", "machine")}, indent=2))
    finally:
        lab.down()


if __name__ == "__main__":
    main()
