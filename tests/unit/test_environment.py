"""Environments made from a user's lock (``environment:``): the platform a node's facts give, the section
read into a plan, and the node's side run for real on this machine (uv, wheels from the machine's own
file index, no network): made offline, reused, waited for, pruned, refused on a full disk, resolved
or refused with the package and the platform named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fsdpctl.backends.transport import LocalTransport
from fsdpctl.environment import resolve as resolving
from fsdpctl.environment.inputs import env_plan_of
from fsdpctl.environment.nodes import index_hosts, make_environments
from fsdpctl.errors import HostError, ProfileError, UsageError
from fsdpctl.plan.environment import EnvPlan, env_plan_from_json
from fsdpctl.profiles.environment_spec import EnvironmentSpec
from fsdpctl.profiles.loader import parse_profile as load_profile_text

FILE_INDEX = Path("/opt/pypi/simple")
"""This machine's own package index (files on disk): resolved from without a network."""

FACTS = {"implementation": "cpython", "machine": "x86_64", "glibc": "2.36", "python": "3.11.7", "cuda_driver": None}


def needs_file_index() -> None:
    if not (FILE_INDEX / "six").is_dir() or not (FILE_INDEX / "mpmath").is_dir():
        pytest.skip(f"no local package index at {FILE_INDEX} with six and mpmath (the testbed machines have one)")


# ---- the platform a node's facts give ----------------------------------------------------------------
@pytest.mark.parametrize(("facts", "platform", "torch"), [
    ({}, "x86_64-manylinux_2_36", "cpu"),
    ({"glibc": "2.41"}, "x86_64-manylinux_2_40", "cpu"),
    ({"glibc": "2.27"}, "x86_64-manylinux_2_17", "cpu"),
    ({"glibc": None}, "x86_64-unknown-linux-musl", "cpu"),
    ({"machine": "aarch64", "cuda_driver": 12080}, "aarch64-manylinux_2_36", "cu128"),
    ({"cuda_driver": 13000}, "x86_64-manylinux_2_36", "cu130"),
    ({"cuda_driver": 12020}, "x86_64-manylinux_2_36", "cu121"),
])
def test_a_nodes_facts_give_the_platform_and_torch_build_it_is_resolved_for(facts, platform, torch):
    target = resolving.target_of({**FACTS, **facts}, "auto", locked=False)
    assert (target.python, target.platform, target.torch_backend) == ("3.11", platform, torch)


def test_torch_backend_settings_and_nodes_no_environment_can_be_made_for():
    assert resolving.target_of(FACTS, "none", locked=False).torch_backend is None
    assert resolving.target_of({**FACTS, "cuda_driver": 12080}, "auto", locked=True).torch_backend is None
    assert resolving.target_of({**FACTS, "cuda_driver": 12080}, "cu126", locked=True).torch_backend == "cu126"
    with pytest.raises(resolving.TargetError, match="glibc is 2.12"):
        resolving.target_of({**FACTS, "glibc": "2.12"}, "auto", locked=False)
    with pytest.raises(resolving.TargetError, match="pypy"):
        resolving.target_of({**FACTS, "implementation": "pypy"}, "auto", locked=False)


# ---- the section read into a plan ------------------------------------------------------------------------
def test_a_requirements_file_is_read_with_its_includes_and_packages_beside_it(tmp_path):
    (tmp_path / "base.txt").write_text("six==1.17.0\n")
    (tmp_path / "requirements.txt").write_text("-r base.txt\nmpmath==1.3.0  # math\n")
    plan = env_plan_of(EnvironmentSpec(file="requirements.txt", packages=("numpy==2.2.6",), find_links=("wheels",)),
                       tmp_path, "lab.yaml: environment")
    lines = plan.files["requirements.txt"].split()
    assert lines[:2] == ["six==1.17.0", "mpmath==1.3.0"] and "numpy==2.2.6" in lines
    assert plan.source == "requirements.txt and packages" and plan.find_links == (str(tmp_path / "wheels"),)


def test_a_uv_lock_travels_with_its_project_and_bad_sections_are_one_line_each(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\ndependencies = ["six"]\n')
    (tmp_path / "uv.lock").write_text("version = 1\n")
    plan = env_plan_of(EnvironmentSpec(file="uv.lock"), tmp_path, "lab.yaml: environment")
    assert set(plan.files) == {"pyproject.toml", "uv.lock"} and plan.source == "uv.lock"
    with pytest.raises(UsageError, match=r"lab.yaml: environment: packages beside a project's uv.lock"):
        env_plan_of(EnvironmentSpec(file="uv.lock", packages=("numpy",)), tmp_path, "lab.yaml: environment")
    with pytest.raises(UsageError, match=r"lab.yaml: environment.file: .*nope.txt does not exist"):
        env_plan_of(EnvironmentSpec(file="nope.txt"), tmp_path, "lab.yaml: environment")
    (tmp_path / "dev.txt").write_text("-e .\n")
    with pytest.raises(UsageError, match="editable install"):
        env_plan_of(EnvironmentSpec(file="dev.txt"), tmp_path, "lab.yaml: environment")
    with pytest.raises(UsageError, match="packages: 'not a requirement!' is not a requirement"):
        env_plan_of(EnvironmentSpec(packages=("not a requirement!",)), tmp_path, "lab.yaml: environment")


def test_the_environments_name_follows_its_inputs_and_base_python_and_survives_json():
    plan = EnvPlan(files={"requirements.txt": "six==1.17.0\n"}, source="requirements.txt")
    one = plan.named("~/fsdpctl/envs", "python3")
    assert one == plan.named("~/fsdpctl/envs", "python3") and one.name.startswith("env-")
    assert one.name != plan.named("~/fsdpctl/envs", "/opt/py312/bin/python").name
    assert one.name != EnvPlan(files={"requirements.txt": "six==1.16.0\n"}).named("~/fsdpctl/envs", "python3").name
    assert one.python == f"~/fsdpctl/envs/{one.name}/bin/python"
    assert env_plan_from_json(json.loads(json.dumps(__import__("dataclasses").asdict(one)))) == one


def test_a_profile_section_is_read_strictly_and_refused_beside_a_container():
    base = "name: lab\nbackend: ssh\nhosts: [a, b]\n"
    loaded = load_profile_text(base + "environment:\n  file: uv.lock\n  torch_backend: cu128\n  keep: 2\n", "lab.yaml")
    assert loaded.environment == EnvironmentSpec(file="uv.lock", torch_backend="cu128", keep=2)
    with pytest.raises(ProfileError, match=r"lab.yaml:6: environment.kep: unknown key; did you mean 'keep'"):
        load_profile_text(base + "environment:\n  file: uv.lock\n  kep: 2\n", "lab.yaml")
    with pytest.raises(ProfileError, match="environment.torch_backend: 'cuda12' is not a build of torch"):
        load_profile_text(base + "environment:\n  file: uv.lock\n  torch_backend: cuda12\n", "lab.yaml")
    with pytest.raises(ProfileError, match="environment: beside container"):
        load_profile_text(base + "environment:\n  file: uv.lock\ncontainer:\n  image: img:1\n", "lab.yaml")


# ---- the node's side, run for real here ----------------------------------------------------------------
def plan_for(tmp_path: Path, lines: str, **fields) -> EnvPlan:
    (tmp_path / "requirements.txt").write_text(lines)
    spec = EnvironmentSpec(file="requirements.txt", index_url=f"file://{FILE_INDEX}", torch_backend="none", **fields)
    return env_plan_of(spec, tmp_path, "lab.yaml: environment").named(str(tmp_path / "node" / "envs"), sys.executable)


def test_extra_index_urls_are_read_and_each_host_is_one_the_nodes_are_asked_to_reach(tmp_path):
    loaded = load_profile_text("name: lab\nbackend: ssh\nhosts: [a, b]\nenvironment:\n  file: requirements.txt\n"
                               "  extra_index_urls: [https://wheels.example.com/simple]\n", "lab.yaml")
    assert loaded.environment.extra_index_urls == ("https://wheels.example.com/simple",)
    plan = plan_for(tmp_path, "six\n", extra_index_urls=("https://wheels.example.com/simple",))
    assert plan.extra_index_urls == ("https://wheels.example.com/simple",)
    assert index_hosts(plan) == ["wheels.example.com"]  # the own index is a folder: no host to reach


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDPCTL_CACHE_DIR", str(tmp_path / "cache"))


def make(plan: EnvPlan, tmp_path: Path):
    return make_environments(plan, [(0, "localhost", LocalTransport(tmp_path))])[0]


def test_a_node_without_uv_makes_the_environment_offline_from_sent_wheels_then_reuses_it(tmp_path):
    needs_file_index()
    plan = plan_for(tmp_path, "six==1.17.0\n", install="sent")
    sent: list[tuple[int, int]] = []
    made = make_environments(plan, [(0, "localhost", LocalTransport(tmp_path))],
                             on_bytes=lambda done, total: sent.append((done, total)))[0]
    root = tmp_path / "node" / "envs"
    assert made.built and made.how == "sent" and made.sent_bytes > 30_000_000  # uv itself, then the wheel
    assert sent[-1][0] == sent[-1][1] == made.sent_bytes
    assert (root / "wheels" / "six-1.17.0-py2.py3-none-any.whl").is_file()
    assert os.access(next(root.glob("tools/uv-*/uv")), os.X_OK)
    record = json.loads((root / made.key / ".fsdpctl-env.json").read_text())
    assert record["packages"] == {"six": "1.17.0"} and record["offline"] is True
    assert os.readlink(root / plan.name) == made.key
    out = subprocess.run([plan.python, "-c", "import six, sys; print(six.__version__, sys.prefix)"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1.17.0", str(root / plan.name)]
    began = time.monotonic()
    again = make(plan, tmp_path)
    assert not again.built and again.key == made.key and again.sent_bytes == 0 and again.how == "reused"
    assert time.monotonic() - began < 3.0  # one helper on the node, no uv run: nothing to make
    assert not list(root.glob(".build-*"))


def test_two_launches_making_the_same_environment_at_once_build_it_once(tmp_path):
    needs_file_index()
    plan = plan_for(tmp_path, "six==1.17.0\nmpmath==1.3.0\n", install="sent")
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(make(plan, tmp_path))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(r.built for r in results) == [False, True] and len({r.key for r in results}) == 1


def test_old_environments_are_pruned_past_keep_but_never_one_in_use(tmp_path):
    needs_file_index()
    root = tmp_path / "node" / "envs"
    first = plan_for(tmp_path, "six==1.17.0\n", keep=1)
    made_first = make(first, tmp_path)
    running = subprocess.Popen([first.python, "-c", "import time; time.sleep(60)"])
    try:
        second = plan_for(tmp_path, "mpmath==1.3.0\n", keep=1)
        made_second = make(second, tmp_path)
        assert made_second.removed == () and (root / made_first.key).is_dir()  # in use: kept
    finally:
        running.kill()
        running.wait()
    third = plan_for(tmp_path, "six==1.17.0\nmpmath==1.3.0\n", keep=1)
    made_third = make(third, tmp_path)
    assert set(made_third.removed) == {made_first.key, made_second.key}
    assert sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("k")) == [made_third.key]
    assert not (root / first.name).exists() and (root / third.name).is_symlink()
    assert sorted(p.name for p in (root / "wheels").iterdir()) == ["mpmath-1.3.0-py3-none-any.whl",
                                                                   "six-1.17.0-py2.py3-none-any.whl"]


def test_a_lock_that_cannot_be_resolved_names_the_package_and_the_platform(tmp_path):
    needs_file_index()
    with pytest.raises(HostError) as caught:
        make(plan_for(tmp_path, "six==99.0\n"), tmp_path)
    text = str(caught.value)
    assert "localhost" in text and "six" in text and "Python 3.11 on x86_64-manylinux_2_" in text
    assert not (tmp_path / "node" / "envs").exists() or not list((tmp_path / "node" / "envs").glob("k*"))


def test_a_python_the_project_does_not_allow_is_named_with_the_fix(tmp_path):
    needs_file_index()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\nrequires-python = ">=3.13"\n'
                                             'dependencies = ["six"]\n')
    plan = env_plan_of(EnvironmentSpec(file="pyproject.toml", index_url=f"file://{FILE_INDEX}", torch_backend="none"),
                       tmp_path, "lab.yaml: environment").named(str(tmp_path / "envs"), sys.executable)
    with pytest.raises(HostError) as caught:
        make(plan, tmp_path)
    assert "Python 3.11" in str(caught.value) and "needs >=3.13" in str(caught.value)
    assert "set `python:` in the profile" in caught.value.hint


def test_a_full_disk_names_the_node_and_leaves_nothing_half_made(tmp_path):
    needs_file_index()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(small)], check=True)
    try:
        plan = plan_for(tmp_path, "six==1.17.0\n", install="sent")
        plan = plan.named(str(small / "envs"), sys.executable)
        with pytest.raises(HostError) as caught:
            make(plan, tmp_path)  # uv alone (38 MB) does not fit
        assert "localhost" in str(caught.value) and f"the disk under {small / 'envs'} is full" in str(caught.value)
        left = [p.name for p in (small / "envs").rglob("*")]
        assert not [name for name in left if name.endswith(".part") or name.startswith((".build-", "k"))], left
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_a_projects_uv_lock_and_a_bare_pyproject_make_the_versions_they_name(tmp_path):
    needs_file_index()
    from fsdpctl.environment.uv import uv_binary

    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\nrequires-python = ">=3.10"\n'
                                            'dependencies = ["six", "mpmath"]\n')
    subprocess.run([uv_binary(), "lock", "--quiet", "--no-config", "--index-url", f"file://{FILE_INDEX}"], cwd=project,
                   check=True, env={k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"})
    import tomllib

    locked = {pkg["name"]: pkg["version"] for pkg in tomllib.loads((project / "uv.lock").read_text())["package"]
              if pkg["name"] != "p"}
    assert set(locked) == {"six", "mpmath"}
    for name in ("uv.lock", "pyproject.toml"):
        if name == "pyproject.toml":
            (project / "uv.lock").unlink()
        spec = EnvironmentSpec(file=name, index_url=f"file://{FILE_INDEX}", torch_backend="auto")
        plan = env_plan_of(spec, project, "lab.yaml: environment").named(str(tmp_path / name / "envs"), sys.executable)
        made = make(plan, tmp_path)
        record = json.loads((tmp_path / name / "envs" / made.key / ".fsdpctl-env.json").read_text())
        assert record["packages"] == locked, name  # a bare pyproject resolves to the same newest versions


# ---- a Slurm job's environment -------------------------------------------------------------------------
def test_a_slurm_plans_first_step_makes_the_environment_and_its_scripts_parse():
    from fsdpctl.backends import plan_run
    from fsdpctl.backends.slurm.plan import SlurmPlan
    from fsdpctl.backends.slurm.scripts import slurm_scripts
    from fsdpctl.plan.types import Overrides
    from fsdpctl.profiles.loader import load_profile

    environment = EnvPlan(files={"requirements.txt": "six==1.17.0\n"}, source="requirements.txt")
    for via in ("sbatch", "submitit"):
        plan = plan_run(load_profile("slurm").profile, run_id="slurm-20261129-000000-abcd", local_run_dir="r",
                        home="/home/me", backend="slurm",
                        overrides=Overrides(environment=environment, backend_options={"via": via}))
        step = SlurmPlan.of(plan).environment_step
        assert plan.python == f"{plan.environment.root}/{plan.environment.name}/bin/python"
        assert step.startswith('srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 ')
        assert "-m fsdpctl.node.envs" in step and '"mode": "staged"' in step
        script = next(iter(slurm_scripts(plan).values()))
        assert script.index("fsdpctl: job $SLURM_JOB_ID") < script.index(step)  # once the head is known
        if via == "sbatch":  # and before the ranks' step
            assert script.index(step) < script.index("srun --kill-on-bad-exit=1 --nodes=")
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_the_nodes_platform_comes_from_their_last_check_and_must_agree(tmp_path, monkeypatch):
    from fsdpctl.environment.staging import cuda_of_driver, platform_facts
    from fsdpctl.hostpool.findings import platform_of, remember_findings

    monkeypatch.setenv("FSDPCTL_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(UsageError, match="never checked") as caught:
        platform_facts("lab")
    assert "fsdpctl doctor -p lab" in caught.value.hint
    facts = {"python": {"version": "3.11.7"}, "gpus": {"driver": "570.133.20", "count": 8},
             "platform": {"machine": "x86_64", "glibc": "2.35", "implementation": "cpython",
                          "executable": "/usr/bin/python3.11"}}
    assert platform_of(facts)["driver"] == "570.133.20" and platform_of({"python": {}}) is None
    remember_findings("lab", {"hosts": [{"host": "a", "facts": facts}, {"host": "b", "facts": facts}]}, "doctor", "t")
    found = platform_facts("lab")
    assert found["cuda_driver"] == 12080 and found["glibc"] == "2.35" and found["python"] == "3.11.7"
    assert resolving.target_of(found, "auto", locked=False).torch_backend == "cu128"
    other = {**facts, "python": {"version": "3.12.1"}}
    remember_findings("lab", {"hosts": [{"host": "b", "facts": other}]}, "doctor", "t")
    with pytest.raises(UsageError, match=r"differ in Python or platform \(.*3.11.7.*3.12.1"):
        platform_facts("lab")
    assert [cuda_of_driver(d) for d in ("580.65.06", "535.183.01", "470.1", None, "x")] == [13000, 12010, None,
                                                                                           None, None]


def test_the_launchers_download_cache_keeps_the_most_recently_used_within_its_bound(tmp_path):
    from fsdpctl.environment.wheels import prune_cache

    folder = tmp_path / "cache" / "wheels"
    for age, name in enumerate(("new", "mid", "old")):
        wheel = folder / name / f"{name}-1.0-py3-none-any.whl"
        wheel.parent.mkdir(parents=True)
        wheel.write_bytes(b"x" * 1000)
        os.utime(wheel, (time.time() - age * 100, time.time() - age * 100))
    prune_cache(2500)
    assert sorted(p.name for p in folder.iterdir()) == ["mid", "new"]


def test_env_on_a_slurm_profile_says_in_one_line_that_it_cannot_list_them(tmp_path):
    """A Slurm job makes its environment in a step of its own; listing and pruning go through SSH only."""
    from tests.conftest import run_cli

    (tmp_path / "cluster_profiles").mkdir()
    (tmp_path / "cluster_profiles" / "s.yaml").write_text("name: s\nbackend: slurm\nslurm:\n  nodes: 2\n"
                                                          "environment:\n  file: requirements.txt\n")
    (tmp_path / "cluster_profiles" / "requirements.txt").write_text("six\n")
    done = run_cli("env", "-p", "s", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "env: backend slurm cannot list or prune the environments on its nodes" in done.stderr
