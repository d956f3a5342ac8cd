"""The environment made from a lock on every node (``environment:``) against doing it by hand.

On the namespace testbed, N hosts (``--nodes 2,8``), each with its own environment folder (a bind mount
per host) and a bare Python (no torch, no numpy); a lock of torch 2.13.0+cpu and numpy 2.2.6 and their
dependencies (11 wheels, 219 MB), resolved from this machine's own file index. The nodes have no route
to an index, as on many clusters: the wheels have to come from the launcher.

  A: `fsdpctl env -p PROFILE --make` on empty nodes, the launcher's cache empty too: resolve, send
     every wheel and uv to every node at once, make the environment on each (the same path a launch
     takes before its preflight)
  B (baseline): by hand, one node after another as a person would: `uv venv` then `uv pip sync
     --offline --find-links WHEELS --require-hashes` over ssh, the wheels and uv already copied to
     every node beforehand (not timed: B leaves the copying out)
  B+copy: the same with the copy timed (`scp` of the wheels and uv to the node, then the sync)
  reuse: A again with every node holding the environment
  launch reused vs none: `fsdpctl launch` of a program that prints one line, its environment already
     made, against the same launch with ``python:`` naming the made environment and no section
Interleaved repeats, medians. Every host shares this machine's 2 cores: N nodes' installs run on the
same 2 cores here, where real nodes each have their own.

Run as root: .venv/bin/python bench/env_build.py [--nodes 2,8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, fsdpctl_env, machine  # noqa: E402

FILE_INDEX = Path("/opt/pypi/simple")
WHEELS = Path("/opt/wheels")
LOCK = "torch==2.13.0+cpu\nnumpy==2.2.6\n"
ONE_LINE = "print('hello from the environment', flush=True)\n"


def base_python() -> str:
    import os

    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def start(nodes: int):
    from tests.testbed.lab import Lab, netns_available

    reason = netns_available()
    if reason:
        sys.exit(f"env_build: the namespace testbed {reason}")
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="fsdpctl-bench-env-"))
    (root / "python" / "bin").mkdir(parents=True)
    (root / "python" / "bin" / "python").symlink_to(base_python())
    (root / "envs").mkdir()
    names = [f"e{i}" for i in range(1, nodes + 1)]
    lab = Lab(root, names).up()
    try:
        for name in names:
            (root / f"envs-{name}").mkdir()
            lab.start_sshd(name, overlays={str(root / "envs"): root / f"envs-{name}"})
    except BaseException:
        lab.down()
        raise
    return root, lab, names


def profiles(root: Path, lab, names: list[str]) -> tuple[Path, Path]:
    (root / "requirements.txt").write_text(LOCK)
    section = (f"environment:\n  file: requirements.txt\n  index_url: file://{FILE_INDEX}\n  find_links: [{WHEELS}]\n"
               f"  torch_backend: none\n  root: {root}/envs\n")
    with_env = root / "with-env.yaml"
    with_env.write_text(lab.profile_yaml(names, python=f"{root}/python/bin/python", name="benv", extra=section))
    return with_env, root / "without-env.yaml"


def clear_nodes(root: Path, names: list[str]) -> None:
    for name in names:  # what is in it: the folder itself is bind-mounted into the host's namespace
        for entry in (root / f"envs-{name}").iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def fsdpctl(lab, root: Path, *args: str, cache: Path) -> tuple[float, str]:
    env = {**fsdpctl_env(root), "FSDPCTL_CACHE_DIR": str(cache)}
    began = time.perf_counter()
    done = subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", *args]), env=env, cwd=root,
                          capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"fsdpctl {' '.join(args)} failed: {done.stderr[-2000:]}")
    return seconds, done.stderr


def by_hand(lab, root: Path, names: list[str], hashed: Path, wheel_files: list[Path], uv: Path,
            copy: bool) -> float:
    """One node after another: (copy the wheels and uv, then) make the venv and sync it offline."""
    ssh = ["ssh", "-i", str(lab.client_key), "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={lab.known_hosts}"]
    scp = ["scp", "-O", "-q", "-i", str(lab.client_key), "-o", "BatchMode=yes", "-o",
           f"UserKnownHostsFile={lab.known_hosts}"]
    began = time.perf_counter()
    for name in names:
        target = f"root@{lab.hosts[name].address}"
        hand = f"{root}/envs/by-hand"
        if copy:
            subprocess.run(lab.in_client([*ssh, target, f"mkdir -p {hand}/wheels"]), check=True)
            files = [str(uv), str(hashed), *map(str, wheel_files)]
            subprocess.run(lab.in_client([*scp, *files, f"{target}:{hand}/wheels/"]), check=True)
        command = (f"cd {hand} && rm -rf venv cache && UV_CACHE_DIR={hand}/cache wheels/uv venv -q --relocatable "
                   f"--python {root}/python/bin/python venv && UV_CACHE_DIR={hand}/cache wheels/uv pip sync -q "
                   f"--python venv/bin/python --offline --no-index --find-links wheels --require-hashes "
                   f"wheels/{hashed.name}")
        subprocess.run(lab.in_client([*ssh, target, command]), check=True)
    return time.perf_counter() - began


def stage_by_hand(root: Path, names: list[str], hashed: Path, wheel_files: list[Path], uv: Path) -> None:
    """The copy B leaves out: the wheels, the hashed lock and uv on every node (each node's own folder)."""
    for name in names:
        folder = root / f"envs-{name}" / "by-hand" / "wheels"
        folder.mkdir(parents=True, exist_ok=True)
        for path in (uv, hashed, *wheel_files):
            shutil.copy2(path, folder / path.name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="2,8")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--launches", type=int, default=5, help="launches of each kind for the reuse cost")
    args = parser.parse_args()
    from fsdpctl.environment.resolve import Target, resolve
    from fsdpctl.environment.uv import uv_binary
    from fsdpctl.environment.wheels import fetch
    from fsdpctl.plan.environment import EnvPlan

    results: dict = {"machine": machine(), "sizes": {}}
    for size in [int(n) for n in args.nodes.split(",")]:
        root, lab, names = start(size)
        try:
            with_env, without_env = profiles(root, lab, names)
            plan = EnvPlan(files={"requirements.txt": LOCK}, index_url=f"file://{FILE_INDEX}",
                           find_links=(str(WHEELS),), torch_backend="none")
            import os

            os.environ["FSDPCTL_CACHE_DIR"] = str(root / "cache-hand")
            here = f"{sys.version_info[0]}.{sys.version_info[1]}"
            wheels = resolve(plan, Target(here, "x86_64-manylinux_2_36", None))
            wheel_files = [fetch(w) for w in wheels]
            hashed = root / "hashed.txt"
            hashed.write_text("".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in wheels))
            uv = Path(uv_binary())
            samples: dict[str, list[float]] = {"fsdpctl env --make (A)": [], "by hand, copied before (B)": [],
                                               "by hand with the copy": [], "reuse (A again)": []}
            sent: list[float] = []
            for repeat in range(args.repeats):
                clear_nodes(root, names)
                cache = root / f"cache-{repeat}"
                seconds, said = fsdpctl(lab, root, "env", "-p", str(with_env), "--make", cache=cache)
                samples["fsdpctl env --make (A)"].append(seconds)
                sent += [float(m) for m in re.findall(r", (\d+) MB sent\)", said)]
                samples["reuse (A again)"].append(fsdpctl(lab, root, "env", "-p", str(with_env), "--make",
                                                          cache=cache)[0])
                clear_nodes(root, names)
                stage_by_hand(root, names, hashed, wheel_files, uv)
                samples["by hand, copied before (B)"].append(by_hand(lab, root, names, hashed, wheel_files, uv, False))
                clear_nodes(root, names)
                samples["by hand with the copy"].append(by_hand(lab, root, names, hashed, wheel_files, uv, True))
            # a launch with the environment made, against the same launch naming its python directly
            clear_nodes(root, names)
            cache = root / "cache-launch"
            fsdpctl(lab, root, "env", "-p", str(with_env), "--make", cache=cache)
            made = next((root / f"envs-{names[0]}").glob("env-*")).name
            without_env.write_text(lab.profile_yaml(names, python=f"{root}/envs/{made}/bin/python", name="bnoenv"))
            (root / "code").mkdir(exist_ok=True)
            (root / "code" / "one.py").write_text(ONE_LINE)
            launches: dict[str, list[float]] = {"launch, environment reused": [], "launch, python named": [],
                                                "its environment phase": []}
            for _ in range(args.launches):
                launches["launch, environment reused"].append(fsdpctl(
                    lab, root, "launch", "-p", str(with_env), "--code", str(root / "code"), "--", "one.py",
                    cache=cache)[0])
                newest = max((root / "runs").glob("benv-*/run.json"), key=lambda p: p.stat().st_mtime)
                span = json.loads(newest.read_text())["timeline"]["phases"]["environment"]["launcher"]
                launches["its environment phase"].append(span[1] - span[0])
                launches["launch, python named"].append(fsdpctl(
                    lab, root, "launch", "-p", str(without_env), "--code", str(root / "code"), "--", "one.py",
                    cache=cache)[0])
            median = {name: statistics.median(v) for name, v in {**samples, **launches}.items()}
            base = median["by hand, copied before (B)"]
            results["sizes"][size] = {
                "median_s": median, "samples": {**samples, **launches},
                "ratio_A_to_B": median["fsdpctl env --make (A)"] / base,
                "ratio_A_to_B_with_copy": median["fsdpctl env --make (A)"] / median["by hand with the copy"],
                "launch_added_s": median["launch, environment reused"] - median["launch, python named"],
                "environment_phase_reused_s": median["its environment phase"],
                "mb_sent_per_node": statistics.median(sent) if sent else None,
                "wheel_mb": sum(p.stat().st_size for p in wheel_files) / 1e6, "uv_mb": uv.stat().st_size / 1e6,
            }
            print(f"\n{size} nodes")
            for name, value in median.items():
                print(f"  {name:34s} {value:8.2f} s")
            row = results["sizes"][size]
            print(f"  A / B {row['ratio_A_to_B']:.2f}x, A / (B with the copy) {row['ratio_A_to_B_with_copy']:.2f}x; "
                  f"a launch adds {row['launch_added_s']:+.2f} s with the environment reused (its phase: "
                  f"{row['environment_phase_reused_s']:.2f} s); "
                  f"{row['mb_sent_per_node']} MB sent per node")
        finally:
            lab.down()
            shutil.rmtree(root, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "env_build.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
