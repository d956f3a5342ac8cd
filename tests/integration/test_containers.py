"""The ranks inside a container image, on the namespace testbed with Podman from Debian's packages and an
image the tests build themselves (``tests/testbed/podman.py``: a Debian root filesystem from mmdebstrap,
a venv with the CPU torch 2.13.0 inside; cached between runs). c1 and c2 share one image store; c3's
store holds another build under the same name, c4's store is empty, and c5 has no podman at all.
Doctor probes inside the image and names each odd host; the bundled workload and a user's gloo program
run inside it on two nodes, over SSH and through Slurm; a stop, a failed rank, a killed launcher and a
lost link each leave no container behind (the runtime's own ``ps -a``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO
from tests.integration.conftest import doctor_json, require_netns
from tests.integration.test_launch import run, run_dir_of, start, wait_for_line
from tests.testbed import podman, podman_image
from tests.testbed.lab import Lab, processes_of
from tests.testbed.slurm import SlurmCluster, slurm_available

NAMES = ["c1", "c2", "c3", "c4", "c5"]
pytestmark = pytest.mark.integration

TRAIN = ("train:\n  preset: tiny\n  steps: {steps}\n  batch_size: 4\n  seq_len: 64\n  log_interval: 2\n"
         "  eval_interval: 0\n  eval_steps: 2\n  vocab_size: 2000\n  fsdp: 2\n")
# A user's program: every rank says which Python runs it, and whether the host's own venv is there
# (it is not inside the image), then all-reduces its rank over gloo across the nodes.
PROGRAM = """\
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank {rank}/{world} python={sys.executable} inside={os.environ.get('FSDPCTL_CONTAINER')} "
      f"host_venv={os.path.exists(sys.argv[1])} sum={value.item():.0f} secret={os.environ.get('CTR_SECRET')}",
      flush=True)
mode = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "fail" and rank == 1:
    sys.exit(3)
if mode == "long":
    print("long: running", flush=True)
    time.sleep(600)
dist.destroy_process_group()
"""


def require_podman() -> None:
    reason = podman.podman_available()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the container tests must run in CI, but {reason}")
        pytest.skip(f"containers: {reason}")


@pytest.fixture(scope="module")
def clab(tmp_path_factory):
    """Five hosts whose sshd (and slurmd) see cgroups; c1, c2 share the image, c3 has another build of
    it, c4 has none, c5 no podman."""
    require_netns()
    require_podman()
    archive = podman_image.image_archive()
    root = tmp_path_factory.mktemp("ctrlab")
    stores = {name: podman.Store(root / f"store-{name}") for name in ("shared", "odd", "empty")}
    lab = Lab(root, NAMES).up()
    try:
        podman_image.load(stores["shared"], archive)
        podman.other_image(stores["odd"])
        setup = podman.cgroup_setup()
        for name, store in (("c1", "shared"), ("c2", "shared"), ("c3", "odd"), ("c4", "empty")):
            lab.start_sshd(name, stores[store].sshd_setenv(), setup=setup)
        lab.start_sshd("c5", stores["shared"].sshd_setenv({"PATH": podman.no_podman_path(root / "no-podman")}),
                       setup=setup)
        yield SimpleNamespace(lab=lab, **stores)
    finally:
        lab.down()
        for store in stores.values():
            store.destroy()


def profile(clab, tmp_path: Path, names: list[str], *, steps: int = 6, image: str = podman.IMAGE,
            extra: str = "") -> Path:
    container = (f"container:\n  image: {image}\n  runtime: podman\n  pull: never\n  host_python: /usr/bin/python3\n"
                 f"  mounts: [\"{REPO}:/fsdpctl-src:ro\"]\n")
    path = tmp_path / "ctr.yaml"
    path.write_text(clab.lab.profile_yaml(names, python=podman.IMAGE_PYTHON, name="ctr",
                                          extra=container + extra + TRAIN.format(steps=steps)))
    return path


def containers_of(store: podman.Store, run_id: str) -> list[str]:
    """The run's containers this store still has, running or not (podman's own ps -a)."""
    return [c["Names"][0] for c in store.containers() if (c.get("Labels") or {}).get("fsdpctl.run") == run_id]


def wait_gone(store: podman.Store, run_id: str, timeout: float) -> list[str]:
    """What is left of the run after ``timeout`` seconds: its containers, then its processes on any host
    (the runtime's client and the node script end a moment after their container)."""
    deadline = time.monotonic() + timeout
    while (left := containers_of(store, run_id) + [str(p) for p in processes_of(run_id)]) \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def user_program(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "prog.py").write_text(PROGRAM)
    return code


def test_doctor_probes_inside_the_image_and_names_each_odd_host(clab, tmp_path):
    rc, data, err = doctor_json(clab.lab, tmp_path, profile(clab, tmp_path, NAMES).read_text())
    assert rc == 1, err
    by_host = {h["host"]: {c["name"]: c for c in h["checks"]} for h in data["hosts"]}
    at = {name: clab.lab.hosts[name].address for name in NAMES}
    image_id = clab.shared.image_id()
    for name in ("c1", "c2"):
        checks = by_host[at[name]]
        assert checks["container-runtime"]["status"] == "pass" and "podman" in checks["container-runtime"]["detail"]
        assert checks["container-image"]["detail"] == f"{podman.IMAGE} sha256:{image_id[:12]}"
        # the image's Python and torch answer, not the host's (/usr/bin/python3 there has no torch)
        assert checks["python"]["detail"].startswith(podman.IMAGE_PYTHON + " 3.11.2"), checks["python"]
        assert checks["torch"]["status"] == "pass" and "2.13.0+cpu" in checks["torch"]["detail"]
        assert all(c["status"] != "fail" for c in checks.values()), checks
    odd = by_host[at["c3"]]
    assert odd["container-image"]["status"] == "pass"
    assert odd["container-probe"]["status"] == "fail"  # that build has no Python at all
    image_row = next(p for p in data["parity"] if p["fact"] == "image")
    assert image_row["status"] == "fail"
    assert image_row["detail"].startswith(f"differs on {at['c3']}=sha256:{clab.odd.image_id()[:12]}"), image_row
    missing = by_host[at["c4"]]["container-image"]
    assert missing["status"] == "fail" and "is not on this host" in missing["detail"], missing
    absent = by_host[at["c5"]]["container-runtime"]
    assert absent["status"] == "fail" and absent["detail"] == "podman is not installed on this host (not on PATH)"
    # the probe's containers are gone again
    assert clab.shared.containers() == [] and clab.odd.containers() == []
    # InfiniBand in the profile: the container sees no /dev/infiniband and the image has no libibverbs
    ib = profile(clab, tmp_path, ["c1"]).read_text().replace("ib: false", "ib: true")
    rc, data, _ = doctor_json(clab.lab, tmp_path, ib)
    (only,) = data["hosts"]
    verdict = next(c for c in only["checks"] if c["name"] == "container-ib")
    assert rc == 1 and verdict["status"] == "fail", only["checks"]
    assert verdict["detail"].startswith("/dev/infiniband is not visible inside and the image has no libibverbs: "
                                        "NCCL would fall back to sockets"), verdict


def test_the_bundled_workload_runs_inside_the_image_on_two_nodes(clab, tmp_path):
    path = profile(clab, tmp_path, ["c1", "c2"], image="localhost/not-this-one:0", steps=6)
    result = run(clab.lab, tmp_path, "launch", "-p", str(path), "--container", podman.IMAGE, timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = run_dir_of(tmp_path)
    merged = (run_dir / "logs" / "merged.log").read_text()
    for rank in (0, 1):
        name = f"fsdpctl-{run_dir.name}-node{rank}-a1"
        assert f"podman container {name} from {podman.IMAGE}" in merged, merged[:3000]
    assert "step=6" in merged
    assert containers_of(clab.shared, run_dir.name) == []


def test_a_users_gloo_program_runs_inside_with_its_secret_masked(clab, tmp_path):
    code = user_program(tmp_path)
    path = profile(clab, tmp_path, ["c1", "c2"])
    host_venv = str(Path(sys.executable).parent)
    argv, env = _launch(clab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--env", "CTR_SECRET",
                        "--", "prog.py", host_venv)
    env["CTR_SECRET"] = "s3cr3t-value-in-the-container"
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run_dir = run_dir_of(tmp_path)
    merged = (run_dir / "logs" / "merged.log").read_text()
    lines = [line for line in merged.splitlines() if " python=" in line]
    assert len(lines) == 2, merged[-3000:]  # one rank per node
    for line in lines:
        assert f"python={podman.IMAGE_PYTHON}" in line and "host_venv=False" in line and "sum=3" in line, line
        assert "inside=fsdpctl-" in line and "secret=***" in line, line
    assert "s3cr3t-value" not in merged
    script = (run_dir / "scripts" / "node0.sh").read_text() if (run_dir / "scripts").is_dir() else ""
    assert "s3cr3t-value" not in script
    assert containers_of(clab.shared, run_dir.name) == []


def _launch(clab, tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    from tests.integration.test_launch import fsdpctl

    return fsdpctl(clab.lab, tmp_path, *args)


def test_stop_a_failed_rank_a_killed_launcher_and_a_lost_link_leave_no_container(clab, tmp_path):
    code = user_program(tmp_path)
    path = profile(clab, tmp_path, ["c1", "c2"])
    lab, store = clab.lab, clab.shared

    # a failed rank, and again in a restart: the other node's container ends too, each attempt its own
    failed = run(lab, tmp_path, "launch", "-p", str(path), "--code", str(code), "--max-restarts", "1",
                 "--", "prog.py", "/x", "fail", timeout=300)
    assert failed.returncode != 0
    run_dir = run_dir_of(tmp_path)
    logs = "".join(p.read_text() for p in run_dir.rglob("merged.log"))
    for attempt in (1, 2):
        assert f"podman container fsdpctl-{run_dir.name}-node1-a{attempt} from" in logs, logs[-3000:]
    assert wait_gone(store, run_dir.name, 20) == [], "a failed run left containers"

    def started(*extra: str) -> tuple[object, str]:
        before = {p.name for p in (tmp_path / "runs").glob("*")}
        proc = start(lab, tmp_path, "launch", "-p", str(path), "--code", str(code), *extra,
                     "--", "prog.py", "/x", "long")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            new = [p for p in (tmp_path / "runs").glob("*/run.json") if p.parent.name not in before]
            if new and len(containers_of(store, new[0].parent.name)) == 2:
                for rank in (0, 1):  # the nodes' own logs (a detached run's launcher keeps none)
                    wait_for_line(lab.root / "work" / "runs" / new[0].parent.name / f"node{rank}.log",
                                  "long: running", 60)
                return proc, new[0].parent.name
            time.sleep(0.5)
        raise AssertionError("the containers never both ran")

    # fsdpctl stop on a detached run; before it, every rank's stack read inside its container (the image's py-spy)
    stopper, run_id = started("--detach")
    stopper.finish(60)
    stacks = run(lab, tmp_path, "stacks", run_id, "--json", timeout=120)
    assert stacks.returncode == 0, stacks.stdout[-2000:] + stacks.stderr[-2000:]
    nodes = json.loads(stacks.stdout)
    nodes = nodes.get("nodes", nodes) if isinstance(nodes, dict) else nodes
    assert sorted(n["node_rank"] for n in nodes) == [0, 1], nodes
    for node in nodes:
        (rank,) = node["ranks"]
        assert rank["method"].startswith("py-spy"), rank
        frames = [f for t in rank["threads"] for f in t["frames"]]
        assert any(f["file"].endswith("prog.py") and f["function"] == "<module>" for f in frames), frames
    stop = run(lab, tmp_path, "stop", run_id, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert wait_gone(store, run_id, 10) == []

    # the launcher killed with SIGKILL: each node's agent ends its part within the node timeout
    launcher, run_id = started("--node-timeout", "6")
    launcher.process.send_signal(signal.SIGKILL)
    assert wait_gone(store, run_id, 40) == [], "a killed launcher left containers or processes"

    # a lost link: c2's card goes down; the launcher stops c1, c2's agent stops its own
    follower, run_id = started("--node-timeout", "6")
    ns = lab.hosts["c2"].namespace
    subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
    try:
        code_, _, _ = follower.finish(120)
        assert code_ != 0
        assert wait_gone(store, run_id, 40) == [], "a lost link left containers or processes"
    finally:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)


def test_through_slurm_each_step_runs_inside_the_image(clab, tmp_path):
    reason = slurm_available()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Slurm testbed must run in CI, but it {reason}")
        pytest.skip(f"Slurm testbed: {reason}")
    cluster = SlurmCluster(clab.lab, ["c1", "c2"], slurmd_setup=podman.cgroup_setup()).up()
    try:
        code = user_program(tmp_path)
        path = tmp_path / "ctrslurm.yaml"
        path.write_text(
            f"name: ctrslurm\nbackend: slurm\ndevice: cpu\nnproc_per_node: 2\npython: {podman.IMAGE_PYTHON}\n"
            f"workdir: {tmp_path}/work\nnetwork:\n  interface: eth0\nslurm:\n  nodes: 2\n  time: \"10\"\n"
            f"container:\n  image: {podman.IMAGE}\n  runtime: podman\n  pull: never\n"
            f"  host_python: /usr/bin/python3\n")
        env = {**os.environ, **cluster.env, **clab.shared.env, "HOME": str(tmp_path),
               "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(REPO), "CTR_SECRET": "slurm-s3cr3t"}
        result = subprocess.run(clab.lab.in_client([sys.executable, "-m", "fsdpctl", "submit", "--slurm", "--follow",
                                                    "-p", str(path), "--code", str(code), "--env", "CTR_SECRET",
                                                    "--", "prog.py", "/x"]),
                                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        run_dir = next((tmp_path / "work" / "runs").glob("*"))
        logs = "".join((run_dir / f"node{r}.log").read_text() for r in (0, 1))
        lines = [line for line in logs.splitlines() if " python=" in line]
        assert len(lines) == 4, logs[-3000:]
        for line in lines:
            assert f"python={podman.IMAGE_PYTHON}" in line and "sum=10" in line and "secret=***" in line, line
            assert "inside=fsdpctl-" in line, line
        assert "slurm-s3cr3t" not in logs
        assert containers_of(clab.shared, run_dir.name) == []
        sbatch = (run_dir / "sbatch.sh").read_text()
        assert "podman run --rm --name" in sbatch and "--env CTR_SECRET" in sbatch and "slurm-s3cr3t" not in sbatch
    finally:
        cluster.down()

