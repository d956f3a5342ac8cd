"""Copying a user's project to 2 nodes on the namespace testbed.

  A: fsdpctl's own path: the code folder collected (what git would commit), packed into the payload
     with the node scripts and the workload, sent to both nodes at once through their SSH
     connections and unpacked by the node agent, which then starts a no-op node script
  B (baseline): what a user types, for both hosts in parallel:
     `tar c -C PROJECT . | ssh HOST 'mkdir -p DIR && tar x -C DIR'`
Both run from the client namespace, connection set-up included, interleaved A B A B.
Goal: A/B <= 1.2, at 50 MB and at 500 MB (results: code_copy.json, code_copy_500mb.json).
Run as root: .venv/bin/python bench/code_copy.py [--mb 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, start_lab, summarize  # noqa: E402

from tests.integration.user_project import write_project  # noqa: E402


def inner(profile_path: str, project: str) -> None:
    """In the client namespace: stage the project on every node the way launch does; print seconds."""
    from fsdpctl.backends import plan_run
    from fsdpctl.backends.nodes.starter import NodeStarter
    from fsdpctl.backends.ssh import SSHBackend
    from fsdpctl.bundle import Payload, collect_code, node_payload
    from fsdpctl.plan.types import Overrides
    from fsdpctl.profiles.loader import load_profile_file
    from fsdpctl.rundir.paths import new_run_id

    started = time.perf_counter()
    profile = load_profile_file(Path(profile_path)).profile
    manifest = collect_code(Path(project), 10**9)
    plan = plan_run(profile, run_id=new_run_id("copy"), local_run_dir="unused",
                    overrides=Overrides(command=("train.py",), code=manifest.plan()))
    scripts = {f"node{n.node_rank}.sh": "exit 0\n" for n in plan.nodes}  # staging only: start nothing
    backend = SSHBackend(profile)
    try:
        NodeStarter(plan, Payload(node_payload(scripts, manifest)), backend.connection, plan.python).start(watch=0.0)
    finally:
        backend.close()
    print(json.dumps({"seconds": time.perf_counter() - started, "run_dir": plan.run_dir}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inner", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(*args.inner)
        return
    root, lab = start_lab("code_copy")
    try:
        project = write_project(root / "project")
        blobs = project / "assets"
        blobs.mkdir()
        for i in range(args.mb):  # incompressible, as model files and binaries are
            (blobs / f"blob{i:03d}.bin").write_bytes(os.urandom(1_000_000))
        subprocess.run(["git", "add", "-A"], cwd=project, check=True)
        subprocess.run(["git", "-c", "user.email=b@e", "-c", "user.name=b", "commit", "-qm", "assets"], cwd=project,
                       check=True)
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable))
        env = {**os.environ, "HOME": str(root), "PYTHONPATH": str(REPO)}
        env.pop("SSH_AUTH_SOCK", None)

        def by_fsdpctl() -> float:
            done = subprocess.run(lab.in_client([sys.executable, __file__, "--inner", str(profile), str(project)]),
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"fsdpctl's copy failed: {done.stderr[-2000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]

        def by_hand() -> float:
            target = f"{root}/work/by-hand-{time.monotonic_ns()}"
            ssh = ["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes", "-o",
                   f"UserKnownHostsFile={lab.known_hosts}"]
            started = time.perf_counter()
            pipes = [subprocess.Popen(lab.in_client(["sh", "-c", f"tar c --exclude=.git -C {project} . | "
                                                     + " ".join(ssh) + f" root@{lab.hosts[name].address} "
                                                     f"'mkdir -p {target}-{name} && tar x -C {target}-{name}'"]),
                                      env=env) for name in ("n1", "n2")]
            if any(p.wait() for p in pipes):
                raise SystemExit("the hand-typed copy failed")
            return time.perf_counter() - started

        samples = interleaved({"fsdpctl (collect, pack, send, unpack, start)": by_fsdpctl,
                               "tar c | ssh tar x, both hosts in parallel": by_hand},
                              repeats=args.repeats, warmup=1)
        size = sum(p.stat().st_size for p in project.rglob("*") if p.is_file() and ".git" not in p.parts)
        report("code_copy" if args.mb == 50 else f"code_copy_{args.mb}mb", "tar c | ssh tar x, both hosts in parallel",
               summarize(samples, "tar c | ssh tar x, both hosts in parallel"),
               {"goal": "fsdpctl ratio <= 1.2", "project_bytes": size, "nodes": 2})
    finally:
        lab.down()


if __name__ == "__main__":
    main()
