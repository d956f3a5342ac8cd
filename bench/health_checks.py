"""Health checks on the namespace testbed: what `doctor --health`, `doctor --links` and the in-run GPU
sampling cost. Every host has the fake GPU tools (tests/testbed/fake_gpu.py: 8 GPUs, a Python script
per call where a real nvidia-smi is a compiled program) first on its PATH.

  doctor:   8 and 32 hosts, `doctor --no-port-check` with the GPU part off (`health.preflight: false`,
            what doctor asked before) as the baseline, against the default (the GPU part) and
            `--health` (also the kernel log, DCGM, InfiniBand). Goal: --health <= 1.5x the baseline.
  links:    `doctor --links` on 4, 8 and 16 hosts: wall time, rounds, pairs. Goal: 8 hosts under 60 s.
  sampling: the bundled workload on 2 hosts with the GPU watcher sampling every 5 s (the default)
            and every second against none (`health.sample_seconds: 0`): median time per step.
            Goal: within noise (5 %).
Interleaved, medians. Run as root: .venv/bin/python bench/health_checks.py [--repeats 3] [--parts doctor,links,sampling]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import fsdpctl_env, interleaved, report, summarize  # noqa: E402

from tests.testbed import fake_gpu  # noqa: E402
from tests.testbed.lab import Lab, netns_available  # noqa: E402

TRAIN = ("train:\n  preset: tiny\n  steps: 40\n  batch_size: 8\n  seq_len: 128\n  log_interval: 2\n"
         "  eval_interval: 0\n  vocab_size: 2000\n  no_checkpoint: true\n")


def fsdpctl(lab: Lab, env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", *args]), env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=env["HOME"])
    return done


def timed(lab: Lab, env: dict, *args: str, ok=(0,)) -> float:
    start = time.perf_counter()
    done = fsdpctl(lab, env, *args)
    if done.returncode not in ok:
        raise SystemExit(f"fsdpctl {' '.join(args)} exited {done.returncode}: {done.stdout[-2000:]} "
                         f"{done.stderr[-2000:]}")
    return time.perf_counter() - start


def doctor_part(lab: Lab, root: Path, env: dict, names: list[str], repeats: int) -> None:
    for size in (8, 32):
        chosen = names[:size]
        plain, default = root / f"plain{size}.yaml", root / f"default{size}.yaml"
        plain.write_text(lab.profile_yaml(chosen, python=sys.executable, name=f"plain{size}",
                                          extra="health:\n  preflight: false\n"))
        default.write_text(lab.profile_yaml(chosen, python=sys.executable, name=f"default{size}"))
        cases = {
            "doctor, no GPU part (before)": lambda p=plain: timed(lab, env, "doctor", "-p", str(p), "--json",
                                                                  "--no-port-check"),
            "doctor (GPU part, default)": lambda p=default: timed(lab, env, "doctor", "-p", str(p), "--json",
                                                                  "--no-port-check"),
            "doctor --health": lambda p=default: timed(lab, env, "doctor", "-p", str(p), "--json", "--no-port-check",
                                                       "--health"),
        }
        summary = summarize(interleaved(cases, repeats), "doctor, no GPU part (before)")
        report(f"health_doctor_{size}", "doctor, no GPU part (before)", summary, {"hosts": size, "gpus_per_host": 8})


def links_part(lab: Lab, root: Path, env: dict, names: list[str]) -> None:
    for size in (4, 8, 16):
        profile = root / f"links{size}.yaml"
        profile.write_text(lab.profile_yaml(names[:size], python=sys.executable, name=f"links{size}"))
        start = time.perf_counter()
        done = fsdpctl(lab, env, "doctor", "-p", str(profile), "--json", "--no-port-check", "--links")
        elapsed = time.perf_counter() - start
        data = json.loads(done.stdout)
        links = data.get("links") or {}
        slow = [c["detail"] for h in data["hosts"] for c in h["checks"]
                if c["name"] == "links" and c["status"] != "pass"]
        print(f"links {size} hosts: {elapsed:.1f} s wall (the check run itself {links.get('seconds', 0):.1f} s), "
              f"{links.get('rounds')} rounds, {len(links.get('pairs') or [])} pairs, "
              f"GB/s {min(p['gbps'] for p in links['pairs']):.3f}-{max(p['gbps'] for p in links['pairs']):.3f}, "
              f"flagged: {slow or 'none'}")
        report(f"health_links_{size}", "links", {"links": {"median_s": elapsed, "min_s": elapsed, "max_s": elapsed,
                                                           "ratio_to_baseline": 1.0, "n": 1}},
               {"hosts": size, "rounds": links.get("rounds"), "pairs": len(links.get("pairs") or []),
                "check_seconds": links.get("seconds"), "flagged": slow})


def step_time(lab: Lab, env: dict, profile: Path) -> float:
    done = fsdpctl(lab, env, "launch", "-p", str(profile))
    if done.returncode != 0:
        raise SystemExit(f"launch failed: {done.stderr[-2000:]}")
    run_id = next(line.split()[2] for line in done.stderr.splitlines() if line.startswith("fsdpctl: run ")
                  and " started " in line)
    shown = json.loads(fsdpctl(lab, env, "report", run_id, "--json").stdout)
    return shown["runs"][0]["step_time_s"]


def sampling_part(lab: Lab, root: Path, env: dict, names: list[str], repeats: int) -> None:
    off, on = root / "sampling-off.yaml", root / "sampling-on.yaml"
    off.write_text(lab.profile_yaml(names[:2], python=sys.executable, name="unsampled",
                                    extra=TRAIN + "health:\n  sample_seconds: 0\n"))
    on.write_text(lab.profile_yaml(names[:2], python=sys.executable, name="sampled",
                                   extra=TRAIN + "health:\n  sample_seconds: 1\n"))
    default = root / "sampling-default.yaml"
    default.write_text(lab.profile_yaml(names[:2], python=sys.executable, name="default", extra=TRAIN))
    cases = {"no sampling": lambda: step_time(lab, env, off),
             "GPUs sampled every 5 s (default)": lambda: step_time(lab, env, default),
             "GPUs sampled every 1 s": lambda: step_time(lab, env, on)}
    summary = summarize(interleaved(cases, repeats, warmup=1), "no sampling")
    report("health_sampling", "no sampling", summary, {"hosts": 2, "unit": "seconds per training step"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="doctor,links,sampling")
    args = parser.parse_args()
    parts = args.parts.split(",")
    reason = netns_available()
    if reason:
        sys.exit(f"health_checks: the namespace testbed {reason}")
    count = 32 if "doctor" in parts else 16 if "links" in parts else 2
    names = [f"h{i}" for i in range(1, count + 1)]
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-health-"))
    lab = Lab(root, names).up()
    try:
        for name in names:
            host = lab.hosts[name]
            bin_dir = fake_gpu.install(host.dir / "bin", host.dir / "gpu.json")
            fake_gpu.write_scenario(host.dir / "gpu.json", [fake_gpu.gpu(0x18 + 0x10 * i) for i in range(8)])
            lab.start_sshd(name, f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n")
        env = fsdpctl_env(root)
        if "doctor" in parts:
            doctor_part(lab, root, env, names, args.repeats)
        if "links" in parts:
            links_part(lab, root, env, names)
        if "sampling" in parts:
            sampling_part(lab, root, env, names, args.repeats)
    finally:
        lab.down()


if __name__ == "__main__":
    main()
