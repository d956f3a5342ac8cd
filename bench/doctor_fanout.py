"""doctor fan-out on the namespace testbed: 1, 8, 16, 32 hosts against OpenSSH running the same probe.

Baselines, measured in the same run with the same probe command line:
  (a) a sequential loop:     for h in hosts; do ssh h "$PROBE"; done
  (b) parallel OpenSSH:      xargs -P 32 ssh h "$PROBE"
Goals: doctor at 32 hosts <= 1.0x (b) and <= 0.5x (a); exactly one SSH connection and one remote
exec per host (counted from each sshd's own log); client CPU seconds per host reported.
All fake hosts share this machine's cores, so wall time grows with the probes' total CPU.

Run as root: .venv/bin/python bench/doctor_fanout.py [--sizes 1,8,16,32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, summarize  # noqa: E402

from fsdpctl.hostcheck.probe import probe_command  # noqa: E402
from tests.testbed.lab import Lab, netns_available  # noqa: E402


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def count_log(lab: Lab, names: list[str], pattern: str) -> dict[str, int]:
    return {n: len(re.findall(pattern, lab.hosts[n].log.read_text())) for n in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,8,16,32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reason = netns_available()
    if reason:
        sys.exit(f"doctor_fanout: the namespace testbed {reason}")
    sizes = [int(s) for s in args.sizes.split(",")]
    names = [f"n{i}" for i in range(1, max(sizes) + 1)]
    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-"))
    lab = Lab(root, names).up()
    results: dict[str, dict] = {}
    try:
        started = time.monotonic()
        for name in names:
            lab.start_sshd(name)
        print(f"testbed: {len(names)} hosts with sshd in {time.monotonic() - started:.1f} s", file=sys.stderr)
        env = {**os.environ, "HOME": str(root), "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)
        probe = probe_command(sys.executable, {"workdir": str(root / "work"), "interface": "eth0", "deep": False})
        ssh = ["ssh", "-i", str(lab.client_key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-l", "root"]
        for size in sizes:
            chosen = names[:size]
            profile = root / f"bench{size}.yaml"
            profile.write_text(lab.profile_yaml(chosen, python=sys.executable, name=f"bench{size}"))
            addresses = "\n".join(lab.hosts[n].address for n in chosen) + "\n"
            doctor = lab.in_client([sys.executable, "-m", "fsdpctl", "doctor", "-p", str(profile), "--json",
                                    "--no-port-check"])
            loop = lab.in_client(["bash", "-c", 'for h in $HOSTS; do "$@" "$h" "$PROBE" >/dev/null || exit 1; done',
                                  "loop", *ssh])
            xargs = lab.in_client(["xargs", "-P", "32", "-I@HOST@", *ssh, "@HOST@", probe])
            cpu: dict[str, list[float]] = {"doctor": []}

            def run_doctor(doctor=doctor, cpu=cpu) -> float:
                before, start = children_cpu(), time.perf_counter()
                done = subprocess.run(doctor, env=env, capture_output=True, text=True, timeout=600)
                elapsed = time.perf_counter() - start
                if done.returncode != 0:
                    raise SystemExit(f"doctor failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
                cpu["doctor"].append(children_cpu() - before)
                return elapsed

            def run_loop(loop=loop, addresses=addresses) -> float:
                start = time.perf_counter()
                subprocess.run(loop, env={**env, "HOSTS": addresses, "PROBE": probe}, check=True,
                               stdout=subprocess.DEVNULL, timeout=600)
                return time.perf_counter() - start

            def run_xargs(xargs=xargs, addresses=addresses) -> float:
                start = time.perf_counter()
                subprocess.run(xargs, env=env, input=addresses, text=True, check=True, stdout=subprocess.DEVNULL,
                               timeout=600)
                return time.perf_counter() - start

            # Connections and execs of exactly one doctor run, from the sshds' own logs.
            before_conn = count_log(lab, chosen, r"Accepted publickey")
            before_exec = count_log(lab, chosen, r"request exec")
            run_doctor()
            conns = {n: c - before_conn[n] for n, c in count_log(lab, chosen, r"Accepted publickey").items()}
            execs = {n: c - before_exec[n] for n, c in count_log(lab, chosen, r"request exec").items()}
            cpu["doctor"].clear()
            cases = {"doctor": run_doctor, "sequential ssh loop": run_loop, "xargs -P 32 ssh": run_xargs}
            samples = interleaved(cases, repeats=args.repeats, warmup=0)
            summary = summarize(samples, "xargs -P 32 ssh")
            seq = summary["sequential ssh loop"]["median_s"]
            extra = {
                "hosts": size,
                "doctor_vs_sequential": summary["doctor"]["median_s"] / seq,
                "connections_per_host": sorted(set(conns.values())),
                "execs_per_host": sorted(set(execs.values())),
                "client_cpu_s_per_host": sorted(cpu["doctor"])[len(cpu["doctor"]) // 2] / size,
            }
            report(f"doctor_fanout_{size}", "xargs -P 32 ssh", summary, extra)
            print(f"  vs sequential: {extra['doctor_vs_sequential']:.3f}; "
                  f"connections/host {extra['connections_per_host']}; execs/host {extra['execs_per_host']}; "
                  f"client CPU/host {extra['client_cpu_s_per_host']:.3f} s")
            results[str(size)] = {"summary": summary, **extra}
    finally:
        lab.down()


if __name__ == "__main__":
    main()
