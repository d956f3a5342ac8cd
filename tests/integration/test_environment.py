"""The environment made from a user's lock on two SSH nodes that differ (``environment:``): e1's Python
has no torch and no numpy, e2's has torch and another numpy. Neither node has a route to a package
index (they are namespaces with no uplink); the launcher, itself in a namespace, resolves from this
machine's own file index and sends the wheels. Each node keeps its environments in a folder only it
sees (a bind mount per host), as real nodes keep theirs on their own disks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.integration.conftest import require_netns
from tests.integration.test_launch import run, run_dir_of
from tests.testbed.lab import Lab

pytestmark = pytest.mark.integration

NAMES = ("e1", "e2")
FILE_INDEX = Path("/opt/pypi/simple")
WHEELS = Path("/opt/wheels")
LOCKED = {"numpy": "2.2.6", "torch": "2.13.0+cpu"}

TRAIN = '''\
import json, os, socket, sys
import numpy, torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if rank == 0:
        print(f"user step={step} loss={loss.item():.4f}", flush=True)
out = os.path.join(os.environ["FSDPCTL_RUN_DIR"], "out")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
    json.dump({"host": socket.gethostname(), "numpy": numpy.__version__, "torch": torch.__version__,
               "prefix": sys.prefix}, handle)
dist.destroy_process_group()
'''


def _base_interpreter() -> str:
    """The real interpreter under this test's venv: a Python with neither torch nor numpy."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


@pytest.fixture(scope="module")
def envlab(tmp_path_factory):
    require_netns()
    for needed in (FILE_INDEX / "numpy", next(WHEELS.glob("torch-2.13.0+cpu-*.whl"), None)):
        if needed is None or not Path(needed).exists():
            pytest.fail(f"this machine's own wheels are missing ({needed}): the environment tests resolve from them")
    root = tmp_path_factory.mktemp("envlab")
    bare = root / "py-e1" / "bin"
    bare.mkdir(parents=True)
    (bare / "python").symlink_to(_base_interpreter())
    subprocess.run([_base_interpreter(), "-m", "venv", "--without-pip", str(root / "py-e2")], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(root / "py-e2")})["purelib"])
    site.mkdir(parents=True, exist_ok=True)  # e2's own Python sees this project's torch and its other numpy
    (site / "project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    for shared in ("python", "envs"):
        (root / shared).mkdir()
    lab = Lab(root, list(NAMES)).up()
    try:
        for name in NAMES:
            envs = root / f"envs-{name}"
            envs.mkdir()
            lab.start_sshd(name, overlays={str(root / "python"): root / f"py-{name}", str(root / "envs"): envs})
        yield lab
    finally:
        lab.down()


def write_profile(lab: Lab, tmp_path: Path) -> Path:
    (tmp_path / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in LOCKED.items()))
    extra = (f"environment:\n  file: requirements.txt\n  index_url: file://{FILE_INDEX}\n"
             f"  find_links: [{WHEELS}]\n  torch_backend: none\n  root: {lab.root}/envs\n")
    path = tmp_path / "envlab.yaml"
    path.write_text(lab.profile_yaml(list(NAMES), python=f"{lab.root}/python/bin/python", name="envlab", extra=extra))
    return path


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    return folder


def test_one_launch_makes_both_nodes_right_then_reuses_and_doctor_and_env_say_so(envlab, tmp_path):
    profile = write_profile(envlab, tmp_path)
    env = {**os.environ, "FSDPCTL_CACHE_DIR": str(tmp_path / "cache")}
    os.environ.update(FSDPCTL_CACHE_DIR=env["FSDPCTL_CACHE_DIR"])  # the launcher's resolutions and downloads

    before = run(envlab, tmp_path, "doctor", "-p", str(profile), "--json", "--no-port-check")
    report = json.loads(before.stdout)
    assert before.returncode == 0, before.stdout[-3000:] + before.stderr[-2000:]  # nothing launch cannot fix
    checks = {h["host"]: {c["name"]: c for c in h["checks"]} for h in report["hosts"]}
    e1 = envlab.hosts["e1"].address
    made = checks[e1]["environment"]
    assert made["status"] == "warn" and "launch will make it" in made["detail"]
    assert checks[e1]["torch"]["status"] == "warn"  # e1's own Python has no torch: the environment brings it

    code = project(tmp_path)
    first = run(envlab, tmp_path, "launch", "-p", str(profile), "--code", str(code), "--", "train.py")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for name in NAMES:
        assert f"{envlab.hosts[name].address}: environment k" in first.stderr
    assert first.stderr.count("made from wheels sent from here") == 2 and "sending wheels" in first.stderr
    assert "user step=2 loss=" in first.stdout
    run_dir = run_dir_of(tmp_path)
    records = [json.loads(p.read_text()) for p in sorted((envlab.root / "work" / "runs" / run_dir.name / "out")
                                                            .glob("rank*.json"))]
    assert sorted(r["host"] for r in records) == sorted(NAMES)
    for record in records:  # every rank imports the locked versions, from the environment
        assert {"numpy": record["numpy"], "torch": record["torch"]} == LOCKED
        assert record["prefix"].startswith(f"{envlab.root}/envs/env-")

    for name in NAMES:  # each node's cache is its own, made offline from what was sent
        envs = envlab.root / f"envs-{name}"
        made = [p for p in envs.iterdir() if p.is_dir() and p.name.startswith("k")]
        assert len(made) == 1, name
        record = json.loads((made[0] / ".fsdpctl-env.json").read_text())
        assert record["offline"] is True and record["packages"]["numpy"] == "2.2.6"
        assert (envs / "wheels" / next(WHEELS.glob("torch-*.whl")).name).is_file()
        assert list(envs.glob("tools/uv-*/uv"))
    own = subprocess.run(envlab.in_host("e2", [f"{envlab.root}/py-e2/bin/python", "-c",
                                                "import numpy; print(numpy.__version__)"]),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert own != LOCKED["numpy"]  # e2's own Python is left as it was

    second = run(envlab, tmp_path, "launch", "-p", str(profile), "--code", str(code), "--", "train.py")
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stderr.count(" reused (") == 2 and "sending wheels" not in second.stderr

    after = run(envlab, tmp_path, "doctor", "-p", str(profile), "--json", "--no-port-check")
    failed = [c for h in json.loads(after.stdout)["hosts"] for c in h["checks"] if c["status"] == "fail"]
    # The one thing left: the bundled workload's tokenizers, which this lock leaves out. The fix
    # doctor gives goes to the lock, not to pip.
    assert [c["name"] for c in failed] == ["packages"] * 2 and after.returncode == 1, failed
    assert all(c["detail"].startswith("tokenizers: not installed") and
               c["hint"].startswith("add them to requirements.txt") for c in failed)
    for host in json.loads(after.stdout)["hosts"]:
        found = {c["name"]: c for c in host["checks"]}
        assert found["environment"]["status"] == "pass" and found["torch"]["status"] == "pass", host["host"]
        assert host["facts"]["torch"]["version"] == LOCKED["torch"]  # judged in the environment

    listed = run(envlab, tmp_path, "env", "-p", str(profile), "--json")
    assert listed.returncode == 0, listed.stderr
    for node in json.loads(listed.stdout):
        assert [e["current"] for e in node["environments"]] == [True]
        assert node["environments"][0]["packages"]["numpy"] == "2.2.6" and node["environments"][0]["bytes"] > 1e8


def test_a_slurm_job_makes_the_environment_in_its_first_step_after_doctor_learned_the_nodes(lab, slurm, tmp_path):
    from tests.integration.test_slurm import fsdpctl as slurm_fsdpctl
    from tests.integration.test_slurm import profile as slurm_profile

    path = slurm_profile(lab, tmp_path, 4)
    (tmp_path / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in LOCKED.items()))
    path.write_text(path.read_text() + f"environment:\n  file: requirements.txt\n  index_url: file://{FILE_INDEX}\n"
                                       f"  find_links: [{WHEELS}]\n  torch_backend: none\n")
    code = project(tmp_path)
    submit = ("submit", "--slurm", "-p", str(path), "--code", str(code), "--follow", "--", "train.py")
    refused = slurm_fsdpctl(lab, slurm, tmp_path, *submit)
    assert refused.returncode == 2 and "were never checked" in refused.stderr and "fsdpctl doctor -p" in refused.stderr
    checked = slurm_fsdpctl(lab, slurm, tmp_path, "doctor", "-p", str(path), "--json")
    assert json.loads(checked.stdout)["hosts"], checked.stderr[-2000:]
    done = slurm_fsdpctl(lab, slurm, tmp_path, *submit)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "the job's first step makes it on every node" in done.stderr
    run_dir = tmp_path / "work" / "runs" / done.stdout.strip().splitlines()[0]
    records = [json.loads(p.read_text()) for p in sorted((run_dir / "out").glob("rank*.json"))]
    assert sorted(r["host"] for r in records) == ["n1", "n2"]
    for record in records:
        assert {"numpy": record["numpy"], "torch": record["torch"]} == LOCKED
        assert record["prefix"].startswith(f"{tmp_path}/work/envs/env-")
    said = next(run_dir.glob("slurm-*.out")).read_text()
    # one node makes it, the other (the same folder here) waits on its lock and finds it made
    assert said.count("environment k") == 2 and said.count(" made on this node") == 1, said[-2000:]
