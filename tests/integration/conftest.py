"""The namespace testbed as pytest fixtures; skipped with the reason where it cannot be built."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.testbed.lab import Lab, netns_available
from tests.testbed.slurm import SlurmCluster, slurm_available

FAKE_TORCH_VERSION = "2.99.0+fake"


def require_netns() -> None:
    reason = netns_available()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the namespace testbed must run in CI, but it {reason}")
        pytest.skip(f"namespace testbed: {reason}")


def fake_torch(root: Path) -> Path:
    """A second Python environment whose torch reports another version (shadows the real one)."""
    site = root / "faketorch"
    pkg = site / "torch"
    (pkg / "distributed" / "fsdp").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("raise ImportError('fake torch for the doctor tests')\n")
    (pkg / "version.py").write_text(f"__version__ = '{FAKE_TORCH_VERSION}'\ncuda = None\n")
    (pkg / "distributed" / "__init__.py").write_text("")
    (pkg / "distributed" / "fsdp" / "__init__.py").write_text("fully_shard = None\n")
    return site


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """Four hosts: n1 and n2 alike, n3 with another torch, n4 whose eth0 is named eth1."""
    require_netns()
    lab = Lab(tmp_path_factory.mktemp("lab"), ["n1", "n2", "n3", "n4"]).up()
    try:
        # n2's shell prints junk on stdout before every command, as a chatty ~/.bashrc would (bash
        # sources it when sshd starts it); only n2's sessions see this stand-in, through a bind mount.
        chatty = lab.root / "chatty.bashrc"
        chatty.write_text("echo 'Welcome to n2! {\"not\": json'; echo '<<<FSDPCTL-PROBE-END>>>'\n")
        bashrc = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".bashrc"
        if not bashrc.exists():
            pytest.fail(f"the chatty-shell host needs {bashrc} to exist to overlay it")
        lab.start_sshd("n2", overlays={str(bashrc): chatty})
        for name in ("n1", "n4"):
            lab.start_sshd(name)
        lab.start_sshd("n3", f"SetEnv PYTHONPATH={fake_torch(lab.root)}\n")
        ns = lab.hosts["n4"].namespace
        for argv in (["link", "set", "eth0", "down"], ["link", "set", "eth0", "name", "eth1"],
                     ["link", "set", "eth1", "up"]):
            subprocess.run(["ip", "-n", ns, *argv], check=True)
        yield lab
    finally:
        lab.down()


@pytest.fixture(scope="session")
def slurm(lab):
    """A Slurm cluster: munged, slurmctld, a slurmd on n1, n2 (the default partition) and n3 (with
    them in the partition ``spares``, for jobs that hold a spare node)."""
    reason = slurm_available()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Slurm testbed must run in CI, but it {reason}")
        pytest.skip(f"Slurm testbed: {reason}")
    cluster = SlurmCluster(lab, ["n1", "n2", "n3"], default=["n1", "n2"]).up()
    yield cluster
    cluster.down()


def run_in_client(lab: Lab, tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``python -m fsdpctl ARGS`` inside the client namespace with a HOME of its own."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "PYTHONPATH": str(REPO)}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run(lab.in_client([sys.executable, "-m", "fsdpctl", *args]), cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def doctor_json(lab: Lab, tmp_path: Path, profile_text: str, *extra: str) -> tuple[int, dict, str]:
    path = tmp_path / "lab.yaml"
    path.write_text(profile_text)
    result = run_in_client(lab, tmp_path, "doctor", "-p", str(path), "--json", *extra)
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON (rc {result.returncode}): {result.stdout!r} {result.stderr}") from None
    return result.returncode, data, result.stderr
