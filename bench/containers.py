"""The ranks inside a container against the same ranks bare, on the namespace testbed: two hosts share one
Podman store with the test image (tests/testbed/podman.py: Debian's Python 3.11 and the CPU torch 2.13.0 in a
venv); bare, the hosts run this machine's venv (torch 2.13.0 too).

  first step: `fsdpctl launch` of the bundled workload (FSDP2, 2 nodes x 1 rank) from the command's start
              to its first `step=` line, image present. Goal: containerised <= 1.15x bare.
  gloo:       `doctor --collectives` bus bandwidth (the median over all-reduce and all-gather at 1 MB
              and 4 MB) inside against bare; also inside with Podman's seccomp filter off, to see what
              it costs. Goal: within 5 %.
Interleaved, medians. Run as root: .venv/bin/python bench/containers.py [--repeats 5] [--gloo-repeats 9]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fsdpctl_env, interleaved, report, summarize  # noqa: E402

from tests.testbed import podman, podman_image  # noqa: E402
from tests.testbed.lab import Lab, netns_available  # noqa: E402

TRAIN = ("train:\n  preset: tiny\n  steps: 4\n  batch_size: 4\n  seq_len: 64\n  log_interval: 1\n"
         "  eval_interval: 0\n  vocab_size: 2000\n  no_checkpoint: true\n  fsdp: 2\n")
CONTAINER = (f"container:\n  image: {podman.IMAGE}\n  runtime: podman\n  pull: never\n"
             "  host_python: /usr/bin/python3\n")


def first_step(lab: Lab, env: dict, profile: Path) -> float:
    """Seconds from `fsdpctl launch` starting to its first step line; the run is then followed to its end."""
    start = time.perf_counter()
    proc = subprocess.Popen(lab.in_client([sys.executable, "-m", "fsdpctl", "launch", "-p", str(profile)]), env=env,
                            cwd=env["HOME"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if seen is None and re.search(r"\bstep=\d+", line):
            seen = time.perf_counter() - start
    if proc.wait() != 0 or seen is None:
        raise SystemExit(f"launch of {profile.name} failed (exit {proc.returncode})")
    return seen


def busbw(lab: Lab, env: dict, profile: Path) -> float:
    """Bus bandwidth, GB/s, of one `doctor --collectives`: the median over all-reduce and all-gather at
    1 MB and up (the small sizes measure latency)."""
    done = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", "doctor", "-p", str(profile), "--json",
                                         "--no-port-check", "--collectives"]), env=env, cwd=env["HOME"],
                          capture_output=True, text=True, timeout=600)
    data = json.loads(done.stdout)
    rows = [r["busbw_gbps"] for r in (data.get("collectives") or {}).get("results", []) if r["bytes"] >= 1 << 20]
    if not rows:
        raise SystemExit(f"no collectives result for {profile.name}: {done.stderr[-2000:]}")
    return statistics.median(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gloo-repeats", type=int, default=9)
    args = parser.parse_args()
    reason = netns_available() or podman.podman_available()
    if reason:
        sys.exit(f"containers: {reason}")
    archive = podman_image.image_archive()
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-ctr-"))
    store = podman.Store(root / "store")
    lab = Lab(root, ["b1", "b2"]).up()
    try:
        store.load(archive)
        for name in ("b1", "b2"):
            lab.start_sshd(name, store.sshd_setenv(), setup=podman.cgroup_setup())
        env = fsdpctl_env(root)
        bare, inside = root / "bare.yaml", root / "inside.yaml"
        bare.write_text(lab.profile_yaml(["b1", "b2"], python=sys.executable, name="bare", extra=TRAIN))
        inside.write_text(lab.profile_yaml(["b1", "b2"], python=podman.IMAGE_PYTHON, name="inside",
                                           extra=TRAIN + CONTAINER))
        unconfined = root / "unconfined.yaml"
        seccomp_off = "  options: [--security-opt=seccomp=unconfined]\n"
        unconfined.write_text(lab.profile_yaml(["b1", "b2"], python=podman.IMAGE_PYTHON, name="unconfined",
                                               extra=TRAIN + CONTAINER + seccomp_off))
        cases = {"bare": lambda: first_step(lab, env, bare),
                 "in a podman container": lambda: first_step(lab, env, inside)}
        summary = summarize(interleaved(cases, args.repeats, warmup=1), "bare")
        report("containers_first_step", "bare", summary, {"unit": "seconds from launch to the first step line",
                                                          "hosts": 2})
        samples = interleaved({"bare": lambda: busbw(lab, env, bare),
                               "in a podman container": lambda: busbw(lab, env, inside),
                               "in a podman container, seccomp off": lambda: busbw(lab, env, unconfined)},
                              args.gloo_repeats, warmup=1)
        gloo = summarize(samples, "bare")
        for row in gloo.values():  # bandwidth: higher is better, the ratio is inside / bare
            row["unit"] = "GB/s"
        report("containers_gloo", "bare", gloo, {"unit": "bus bandwidth GB/s (higher is better)", "hosts": 2,
                                                  "samples": samples})
        left = store.containers()
        print(f"containers left in the store: {len(left)}")
    finally:
        lab.down()
        store.destroy()


if __name__ == "__main__":
    main()
