"""Launch overhead on the 2-host namespace testbed: time to the first line of training output.

  A: `fsdpctl launch -p lab` from the client namespace (preflight, staging over SSH, start, stream)
  A': the same launch from Python, `fsdpctl.launch(profile, on_event=...)` printing the lines
  B (baseline): the same node scripts (the torchrun lines a user would type) started by hand in each
     host's namespace at once, no SSH, the code already in place
Both for the bundled workload (to rank 0's first `step=` line) and for a user's script in a 1 MB
project (to its first `user step=` line; fsdpctl copies the project each time), interleaved.
Goal: A/B <= 1.2 for both; A'/A within noise. Run as root: .venv/bin/python bench/launch_overhead.py [--repeats 3]
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
from harness import fsdpctl_env, interleaved, report, start_lab, summarize  # noqa: E402

from tests.integration.user_project import write_project  # noqa: E402

# A script driving the API as a user's would: every line of the run printed, nothing else.
API_SCRIPT = ("import sys, fsdpctl\n"
              "def show(event):\n"
              "    if isinstance(event, fsdpctl.LogLine):\n"
              "        print(event.text, flush=True)\n"
              "fsdpctl.launch(sys.argv[1], on_event=show)\n")
TRAIN = ("train:\n  preset: tiny\n  steps: 3\n  batch_size: 4\n  seq_len: 64\n  log_interval: 1\n"
         "  eval_interval: 0\n  eval_steps: 1\n  vocab_size: 2000\n  no_checkpoint: true\n")


def first_step(processes: list[subprocess.Popen], started: float, timeout: float = 300,
               marker: str = "step=") -> float:
    """Seconds until the first process prints ``marker``; then wait for all to finish."""
    found = None
    deadline = time.monotonic() + timeout
    stream = processes[0].stdout
    assert stream is not None
    for raw in stream:
        if marker in raw and found is None:
            found = time.perf_counter() - started
        if time.monotonic() > deadline:
            break
    for process in processes:
        if process.wait(timeout=timeout) != 0:
            raise SystemExit(f"a run failed (exit {process.returncode})")
    if found is None:
        raise SystemExit("no training step was printed")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    root, lab = start_lab("launch_overhead")
    try:
        profile = root / "lab.yaml"
        profile.write_text(lab.profile_yaml(["n1", "n2"], python=sys.executable) + TRAIN)
        env = fsdpctl_env(root)
        fsdpctl = [sys.executable, "-m", "fsdpctl"]

        project = write_project(root / "project")
        (project / "assets.bin").write_bytes(os.urandom(1_000_000))  # a 1 MB project in all
        subprocess.run(["git", "add", "-A"], cwd=project, check=True)
        subprocess.run(["git", "-c", "user.email=b@e", "-c", "user.name=b", "commit", "-qm", "1 MB"], cwd=project,
                       check=True)
        user = ["--code", str(project), "--env", "STEPS=3", "--", "train.py"]

        def by_fsdpctl(*extra: str, marker: str = "step=") -> float:
            started = time.perf_counter()
            process = subprocess.Popen(lab.in_client([*fsdpctl, "launch", "-p", str(profile), *extra]), env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            return first_step([process], started, marker=marker)

        def by_api() -> float:
            started = time.perf_counter()
            process = subprocess.Popen(lab.in_client([sys.executable, "-c", API_SCRIPT, str(profile)]), env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            return first_step([process], started)

        def ssh_exec() -> float:
            started = time.perf_counter()
            subprocess.run(lab.in_client(["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes",
                                          "-o", f"UserKnownHostsFile={lab.known_hosts}",
                                          f"root@{lab.hosts['n1'].address}", "true"]), env=env, check=True,
                           capture_output=True)
            return time.perf_counter() - started

        def by_hand(*command: str, marker: str = "step=") -> float:
            out = root / f"rendered-{time.monotonic_ns()}"
            subprocess.run([*fsdpctl, "render", "-p", str(profile), "--out", str(out), *command], env=env,
                           check=True, capture_output=True, cwd=project)
            # What a user would have typed: the workload and the code put in place by hand once
            # (not timed), then one line per host.
            run_dir = Path(__import__("json").loads((out / "plan.json").read_text())["run_dir"])
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "pkg").symlink_to(REPO, target_is_directory=True)
            (run_dir / "code").symlink_to(project, target_is_directory=True)
            started = time.perf_counter()
            processes = [subprocess.Popen(
                ["ip", "netns", "exec", lab.hosts[name].namespace, "unshare", "--uts", "sh", "-c",
                 f'hostname {name} && exec bash {out}/node{rank}.sh'], env=env, text=True,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=subprocess.STDOUT)
                for rank, name in enumerate(["n1", "n2"])]
            return first_step(processes, started, marker=marker)

        by_fsdpctl()  # warm the tokenizer cache and the page cache
        samples = interleaved({"fsdpctl launch": by_fsdpctl,
                               "fsdpctl launch --no-preflight": lambda: by_fsdpctl("--no-preflight"),
                               "fsdpctl.launch() from Python": by_api,
                               "hand-typed torchrun per host": by_hand},
                              repeats=args.repeats, warmup=0)
        user_samples = interleaved(
            {"fsdpctl launch -- user script (1 MB project)": lambda: by_fsdpctl(*user, marker="user step="),
             "hand-typed torchrun per host, user script": lambda: by_hand("--env", "STEPS=3", "--", "train.py",
                                                                          marker="user step=")},
            repeats=args.repeats, warmup=1)
        # What one SSH command costs on these hosts (connection + the login shell's rc files):
        # launch needs two before the nodes start (preflight, stage+start), --no-preflight one.
        exec_cost = sorted(ssh_exec() for _ in range(5))[2]
        report("launch_overhead", "hand-typed torchrun per host",
               summarize(samples, "hand-typed torchrun per host"),
               {"goal": "fsdpctl launch ratio <= 1.2; fsdpctl.launch() within noise of it",
                "ssh_exec_seconds": exec_cost})
        report("launch_user_script", "hand-typed torchrun per host, user script",
               summarize(user_samples, "hand-typed torchrun per host, user script"),
               {"goal": "ratio <= 1.2", "project_bytes": sum(p.stat().st_size for p in project.rglob("*")
                                                              if p.is_file() and ".git" not in p.parts)})
        print(f"one `ssh host true` on this testbed: {exec_cost:.3f} s")
    finally:
        lab.down()


if __name__ == "__main__":
    main()
