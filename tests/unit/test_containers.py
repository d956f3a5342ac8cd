"""Containers without a runtime: the node script's two halves run for real with a stand-in runtime that
records its arguments and environment, then starts the script's second half as the image would; the
flags each runtime gets; Pyxis in the batch script; the container checks' verdicts; profile errors."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpctl.backends import plan_run, render_scripts
from fsdpctl.backends.nodes.commands import kill_command
from fsdpctl.container.judge import container_checks
from fsdpctl.errors import ProfileError, UsageError
from fsdpctl.hostcheck.checks import HostReport, judge_parity
from fsdpctl.plan.types import CodePlan, Overrides
from fsdpctl.profiles.loader import parse_profile

IMAGE = "registry.example/team/train:1.0"
PROFILE = """\
name: ctr
backend: ssh
hosts: [10.9.0.1, 10.9.0.2]
device: {device}
nproc_per_node: 2
workdir: {workdir}
network: {{interface: eth0, ib: {ib}}}
secrets: [HF_TOKEN]
python: /opt/venv/bin/python
container:
  image: {image}
  runtime: {runtime}
  mounts: [/data:/data:ro]
  options: [--shm-size=1g]
"""
# The stand-in runtime: records how it was started, then runs what the image would (the script's second
# half, with the variables it was told to pass on by name, and the container's mark).
FAKE_RUNTIME = f"""\
#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
out = os.environ["FAKE_OUT"]
json.dump({{"argv": args, "env": dict(os.environ)}}, open(os.path.join(out, "runtime.json"), "w"))
names = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
env = {{"PATH": os.environ["PATH"], "FAKE_OUT": out, "HOME": "/nonexistent-inside"}}
for name in names:
    key, sep, value = name.partition("=")
    if sep:
        env[key] = value
    elif key in os.environ:
        env[key] = os.environ[key]
image_at = args.index(os.environ["FAKE_IMAGE"])
os.execvpe(args[image_at + 1], args[image_at + 1:], env)
"""
FAKE_PYTHON = f"""\
#!{sys.executable}
import json, os, sys
if sys.argv[1:3] == ["-m", "fsdpctl.node.gpu_watch"]:
    open(os.path.join(os.environ["FAKE_OUT"], "watch.json"), "w").write(json.dumps(sys.argv))
    sys.exit(0)
json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}},
          open(os.path.join(os.environ["FAKE_OUT"], "ranks.json"), "w"))
"""


def plan_of(tmp_path: Path, runtime: str = "podman", *, device: str = "cpu", ib: str = "false",
            backend: str | None = None, overrides: Overrides | None = None, image: str = IMAGE):
    text = PROFILE.format(device=device, ib=ib, image=image, runtime=runtime, workdir=tmp_path / "work")
    if backend == "slurm":
        text = text.replace("backend: ssh", "backend: slurm").replace("hosts: [10.9.0.1, 10.9.0.2]\n", "")
        text += "slurm: {nodes: 2, gpus_per_node: 8}\n"
    profile = parse_profile(text, "ctr.yaml")
    return plan_run(profile, run_id="ctr-20261125-120000-abcd", local_run_dir=str(tmp_path / "runs"),
                    local_python="/usr/bin/python3", home=str(tmp_path), local_cwd=str(tmp_path),
                    backend=backend, overrides=overrides)


def executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_script_starts_the_image_and_its_second_half_runs_torchrun_inside(tmp_path):
    plan = plan_of(tmp_path)
    script = render_scripts(plan)["node1.sh"]
    fake_bin, out = tmp_path / "bin", tmp_path / "out"
    fake_bin.mkdir()
    out.mkdir()
    executable(fake_bin / "podman", FAKE_RUNTIME)
    executable(fake_bin / "python3", FAKE_PYTHON)  # the host's Python: the GPU sampler
    inside = tmp_path / "opt-venv-python"
    executable(inside, FAKE_PYTHON)
    script = script.replace("/opt/venv/bin/python", str(inside))  # the image's Python, here
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "node1.sh").write_text(script)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "FAKE_OUT": str(out), "FAKE_IMAGE": IMAGE, "HOME": str(tmp_path),
           "HF_TOKEN": "hf_secret_value_123"}
    done = subprocess.run(["bash", str(run_dir / "node1.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    runtime = json.loads((out / "runtime.json").read_text())
    argv = runtime["argv"]
    name = "fsdpctl-ctr-20261125-120000-abcd-node1-a1"
    assert argv[:4] == ["run", "--rm", "--name", name]
    for flag in (["--network", "host"], ["--ipc", "host"], ["-v", f"{run_dir}:{run_dir}"], ["-v", "/data:/data:ro"],
                 ["--env", "HF_TOKEN"], ["--env", f"FSDPCTL_CONTAINER={name}"], ["-w", str(run_dir)]):
        assert any(argv[i:i + len(flag)] == flag for i in range(len(argv))), (flag, argv)
    assert "--label=fsdpctl.run=ctr-20261125-120000-abcd" in argv and "--label=fsdpctl.node=1" in argv
    assert "--shm-size=1g" in argv and argv[argv.index(IMAGE) + 1:] == ["bash", str(run_dir / "node1.sh")]
    # the secret reaches the runtime in its environment, never in an argument
    assert runtime["env"]["HF_TOKEN"] == "hf_secret_value_123"
    assert not any("hf_secret_value_123" in a for a in argv)
    # no GPU flag on a CPU profile, no IB device without ib: true
    assert "--gpus" not in argv and "/dev/infiniband" not in argv
    # inside: torchrun from the image's Python, the run's variables passed on by name
    ranks = json.loads((out / "ranks.json").read_text())
    assert ranks["argv"][:2] == ["-m", "torch.distributed.run"]
    assert ranks["env"]["FSDPCTL_CONTAINER"] == name and ranks["env"]["FSDPCTL_NODE_RANK"] == "1"
    assert ranks["env"]["HF_TOKEN"] == "hf_secret_value_123" and ranks["env"]["FSDPCTL_RUN_ID"] == plan.run_id
    assert ranks["cwd"] == str(run_dir)
    # the GPU sampler runs once, on the host, with the host's Python (not again inside)
    assert json.loads((out / "watch.json").read_text())[1:3] == ["-m", "fsdpctl.node.gpu_watch"]


@pytest.mark.parametrize(("runtime", "gpu", "ib"), [
    ("docker", "--gpus all", "--device /dev/infiniband"),
    ("podman", "--device nvidia.com/gpu=all", "--device /dev/infiniband"),
    ("apptainer", "--nv", None),
])
def test_each_runtime_gets_the_gpus_and_ib_devices_where_the_node_has_them(tmp_path, runtime, gpu, ib):
    script = render_scripts(plan_of(tmp_path, runtime, device="cuda", ib="true"))["node0.sh"]
    assert f"if [ -e /dev/nvidiactl ]; then flags+=({gpu}); fi" in script
    assert (f"if [ -d /dev/infiniband ]; then flags+=({ib}); fi" in script) == (ib is not None)
    start = next(line for line in script.splitlines() if line.strip().startswith("exec ") and IMAGE in line)
    if runtime == "apptainer":
        assert start.split()[1:3] == ["apptainer", "exec"] and "--name" not in start and "--bind" in start
    else:
        assert start.split()[1:4] == [runtime, "run", "--rm"] and "--pull=missing" in start
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_pyxis_flags_are_in_the_batch_script_and_podman_runs_in_the_step(tmp_path):
    user = Overrides(command=("train.py",), code=CodePlan(source=str(tmp_path), files=1, bytes=1, largest=(),
                                                         origin="files"), secrets=("HF_TOKEN",))
    plan = plan_of(tmp_path, "pyxis", device="cuda", ib="true", backend="slurm", overrides=user,
                   image="nvcr.io#nvidia/pytorch:25.01-py3")
    sbatch = render_scripts(plan)["sbatch.sh"]
    srun = next(line for line in sbatch.splitlines() if line.startswith("srun "))
    run_dir = plan.run_dir
    assert "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3'" in srun
    assert f"--container-mounts={run_dir}:{run_dir},{tmp_path}/work/cache:{tmp_path}/work/cache,/data:/data:ro" in srun
    assert f"--container-workdir={run_dir}" in srun and "--shm-size=1g" in srun
    assert "/opt/venv/bin/python -m torch.distributed.run" in srun  # the image's Python runs torchrun
    assert "podman" not in sbatch and "export FSDPCTL_PYTHON=/usr/bin/python3" not in sbatch
    stepped = render_scripts(plan_of(tmp_path, "podman", backend="slurm", overrides=user))["sbatch.sh"]
    assert "podman run --rm --name fsdpctl-ctr-20261125-120000-abcd-node\"$SLURM_NODEID\"-s" in stepped
    assert "--env HF_TOKEN" in stepped and "trap '\"'\"'podman rm -f" in stepped
    assert "export FSDPCTL_PYTHON=python3" in stepped  # the hosts' own Python: the mask and the sampler


def test_pyxis_is_refused_where_hosts_are_reached_directly():
    text = PROFILE.format(device="cpu", ib="false", image=IMAGE, runtime="pyxis", workdir="/w")
    with pytest.raises(ProfileError, match=r"container\.runtime: pyxis starts containers through Slurm"):
        parse_profile(text, "ctr.yaml")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("mounts", "[data]", r"container\.mounts\[0\]: 'data' is not HOST:CONTAINER\[:ro\]"),
    ("mounts", "[/a:relative]", r"container\.mounts\[0\]"),
    ("options", "[shm-size=1g]", r"container\.options\[0\]: 'shm-size=1g' is not a runtime flag"),
    ("image", "'bad image; rm -rf /'", r"container\.image: .* is not an image name"),
    ("runtime", "dockr", r"did you mean 'docker'"),
    ("pull", "sometimes", r"container\.pull"),
])
def test_a_bad_container_section_is_one_line_naming_the_field(field, value, message):
    text = PROFILE.format(device="cpu", ib="false", image=IMAGE, runtime="docker", workdir="/w")
    lines = [f"  {field}: {value}" if line.startswith(f"  {field}:") else line for line in text.splitlines()]
    if not any(line.startswith(f"  {field}:") for line in text.splitlines()):
        lines.append(f"  {field}: {value}")
    with pytest.raises(ProfileError, match=message):
        parse_profile("\n".join(lines) + "\n", "ctr.yaml")


def test_container_flag_replaces_the_image_and_is_checked(tmp_path):
    from fsdpctl.api.prepare import with_container
    from fsdpctl.profiles.loader import LoadedProfile

    text = PROFILE.format(device="cpu", ib="false", image=IMAGE, runtime="podman", workdir="/w")
    loaded = LoadedProfile(parse_profile(text, "ctr.yaml"), tmp_path / "ctr.yaml", text)
    assert with_container(loaded, "other/img:2").profile.container.image == "other/img:2"
    assert with_container(loaded, "other/img:2").profile.container.runtime == "podman"
    with pytest.raises(UsageError, match="--container: 'a b' is not an image name"):
        with_container(loaded, "a b")
    plan = plan_of(tmp_path, overrides=Overrides(container_image="other/img:2"))
    assert plan.container.image == "other/img:2" and "other/img:2 bash" in render_scripts(plan)["node0.sh"]


def test_stopping_a_containerised_run_removes_its_containers_by_label():
    command = kill_command("ctr-1", 1.0, "podman")
    assert "podman ps -aq --filter label=fsdpctl.run=ctr-1" in command and "podman rm -f $ids" in command
    assert "podman" not in kill_command("ctr-1", 1.0)


FOUND = {"runtime": "podman", "image": IMAGE, "path": "/usr/bin/podman", "version": "podman version 4.3.1",
         "image_state": "present", "digest": "sha256:" + "a" * 64,
         "inside": {"python": {"path": "/opt/venv/bin/python", "version": "3.11.2"},
                    "ib_devices": True, "libibverbs": True}}


@pytest.mark.parametrize(("change", "check", "status", "words"), [
    ({}, "container-image", "pass", f"{IMAGE} sha256:aaaaaaaaaaaa"),
    ({"error": "not-installed"}, "container-runtime", "fail", "podman is not installed on this host"),
    ({"error": "not-usable", "detail": "Cannot connect to the Docker daemon"}, "container-runtime", "fail",
     "does not answer: Cannot connect"),
    ({"image_state": "missing", "image_error": "no such image"}, "container-image", "fail",
     "not pulled (container.pull: never)"),
    ({"image_state": "missing", "pulled": False, "pull_error": "manifest unknown"}, "container-image", "fail",
     "pull failed: manifest unknown"),
    ({"pulled": True}, "container-image", "pass", "(pulled now)"),
    ({"inside": {"error": "exec: python3: not found"}}, "container-probe", "fail", "python3: not found"),
    ({"inside": {**FOUND["inside"], "ib_devices": False}}, "container-ib", "fail",
     "/dev/infiniband is not visible inside: NCCL would fall back to sockets"),
    ({"inside": {**FOUND["inside"], "libibverbs": False}}, "container-ib", "fail", "the image has no libibverbs"),
    ({}, "container-ib", "pass", "/dev/infiniband and libibverbs inside the image"),
])
def test_container_verdicts(change, check, status, words):
    checks = {c.name: c for c in container_checks({**FOUND, **change}, ib=True)}
    assert checks[check].status == status and words in checks[check].detail, checks[check]
    assert checks[check].status == "pass" or checks[check].hint


def test_without_infiniband_in_the_profile_the_image_needs_none():
    found = {**FOUND, "inside": {**FOUND["inside"], "ib_devices": False, "libibverbs": False}}
    assert "container-ib" not in {c.name for c in container_checks(found, ib=False)}


def test_another_build_of_the_image_on_one_host_fails_the_parity_row():
    profile = parse_profile(PROFILE.format(device="cpu", ib="false", image=IMAGE, runtime="podman", workdir="/w"),
                            "ctr.yaml")
    base = {"python": {"version": "3.11.2"}, "torch": {"version": "2.13.0"}, "gpus": {}, "interfaces": {}}
    reports = [HostReport(host=f"h{i}", node_rank=i, facts={**base, "container": {"digest": digest}})
               for i, digest in enumerate(["sha256:" + "a" * 64, "sha256:" + "a" * 64, "sha256:" + "b" * 64])]
    row = next(p for p in judge_parity(profile, reports) if p.fact == "image")
    assert row.status == "fail" and row.detail == "differs on h2=sha256:bbbbbbbbbbbb (others: sha256:aaaaaaaaaaaa)"
    assert "pull the image again" in row.hint


def test_no_container_section_changes_nothing(tmp_path):
    text = PROFILE.format(device="cpu", ib="false", image=IMAGE, runtime="podman", workdir=tmp_path)
    profile = parse_profile(text.split("container:")[0], "bare.yaml")
    assert profile.container is None
    plan = plan_run(profile, run_id="bare-20261125-120000-abcd", local_run_dir=str(tmp_path / "runs"),
                    local_python="/usr/bin/python3", home=str(tmp_path), local_cwd=str(tmp_path))
    assert plan.container is None and "FSDPCTL_CONTAINER" not in render_scripts(plan)["node0.sh"]
    assert os.path.basename(plan.host_python) == "python"


def test_init_notes_the_runtimes_and_writes_a_container_stub():
    from fsdpctl.api.init import container_stub
    from fsdpctl.hostcheck.findings import HostFinding

    both = (("docker", "Docker version 28.2.2, build e6534b4"), ("podman", "podman version 4.3.1"))
    findings = [HostFinding(host="h1", node_rank=0, runtimes=both),
                HostFinding(host="h2", node_rank=1, runtimes=both[1:]),
                HostFinding(host="h3", node_rank=2, error="unreachable")]
    lines = container_stub(findings, slurm=False)
    assert lines[0] == "Container runtimes found: Docker version 28.2.2 on h1; podman version 4.3.1 on all 2 hosts."
    assert "  runtime: podman" in lines and "container:" in lines
    slurm = container_stub([HostFinding(host="n1", node_rank=0, runtimes=(("enroot", "3.4.1"),))], slurm=True)
    assert "  runtime: pyxis" in slurm
    assert container_stub([HostFinding(host="h1", node_rank=0)], slurm=False)[0].startswith("No container runtime")


def test_pyxis_nodes_are_asked_for_enroot_and_their_own_facts_stand():
    checks = {c.name: c for c in container_checks({"runtime": "pyxis", "image": "nvcr.io#x", "path": "/usr/bin/enroot",
                                                   "version": "3.4.1", "image_state": "remote"}, ib=True)}
    assert checks["container-runtime"].detail == "enroot 3.4.1 at /usr/bin/enroot"
    assert checks["container-probe"].status == "warn" and "container-ib" not in checks
    missing = container_checks({"runtime": "pyxis", "image": "nvcr.io#x", "error": "not-installed"}, ib=False)
    assert missing[0].status == "fail" and missing[0].detail.startswith("enroot (which Pyxis runs)")


def test_the_longest_command_lines_stay_within_one_argument_of_the_kernel(tmp_path):
    """Linux refuses a single argument over 128 KiB (MAX_ARG_STRLEN): an SSH command reaches the node
    as one (``sh -c``), and srun gets the Slurm probe as one. The probe hands itself to other Pythons
    compressed; these are the largest commands fsdpctl sends, with a container and ``init``'s asks."""
    from fsdpctl.backends.base import DoctorRequest
    from fsdpctl.backends.nodes.commands import agent_command
    from fsdpctl.backends.slurm.doctor import node_probe_script
    from fsdpctl.hostcheck.probe import container_probe_args, packed_probe_source

    plan = plan_of(tmp_path, device="cuda", ib="true")
    probe = {"workdir": "/w", "packages": ["torch", "numpy", "tokenizers"], "deep": True,
             "container": container_probe_args(plan.container, plan.python), "health": {"xid": True}}
    agent = agent_command(plan.host_python, {"run_id": plan.run_id, "run_dir": plan.run_dir, "probe": probe})
    slurm = plan_of(tmp_path, "podman", backend="slurm")
    profile = parse_profile(PROFILE.format(device="cuda", ib="true", image=IMAGE, runtime="podman", workdir="/w")
                            .replace("backend: ssh", "backend: slurm").replace("hosts: [10.9.0.1, 10.9.0.2]\n", "")
                            + "slurm: {nodes: 2}\n", "s.yaml")
    asks = {"init": {"master": "x", "probe_packed": packed_probe_source()}, "health": {"xid": True}}
    request = DoctorRequest(port=29500, deep=True, extra=asks)
    script = node_probe_script(profile, slurm.host_python, 2, request, "/w/token")
    for command in (agent, script):
        assert len(command.encode()) < 100_000, len(command)
