"""fsdpctl as a user installs it: the wheel and the sdist built from the tree, the wheel installed
(not editable) into a clean virtual environment with its dependencies, and used from a folder far
from the repository: help, profiles, a dry run, a real two-rank training run of the bundled
workload, the dashboard serving its page and chart library, an HTML report, completion. And the
wheel alone, no extras and no torch (README's `pip install .`): every command's help, and the
getting-started launch ending in fsdpctl's own error, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.workload


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The folder with the wheel and the sdist built from the tree."""
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", str(dist), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return dist


def clean_venv(root: Path, *install: str) -> Path:
    """A new virtual environment in ``root/venv`` with ``install`` (pip's arguments) in it; its bin folder."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *install],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> tuple[Path, Path]:
    """(the clean environment's bin folder, the dist folder with the wheel and the sdist)."""
    wheel = next(dist.glob("fsdpctl-*.whl"))
    # torch pinned as the dev environment has it (an unpinned one would pull the CUDA build)
    torch = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return clean_venv(tmp_path_factory.mktemp("installed"), f"torch=={torch}", f"{wheel}[workload]"), dist


@pytest.fixture(scope="module")
def plain(dist, tmp_path_factory) -> tuple[Path, Path]:
    """As ``installed``, with the wheel alone: its declared dependencies and nothing else (no extras, no torch)."""
    return clean_venv(tmp_path_factory.mktemp("plain"), str(next(dist.glob("fsdpctl-*.whl")))), dist


def use(installed: tuple[Path, Path], cwd: Path, *args: str, timeout: float = 300,
        env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FSDPCTL_DEBUG")}
    clean.update(HOME=str(cwd), XDG_CONFIG_HOME=str(cwd / ".config"), FSDPCTL_RUNS_DIR=str(cwd / "runs"),
                 PATH=f"{installed[0]}:{clean.get('PATH', '')}", **(env or {}))
    return subprocess.run([str(installed[0] / "fsdpctl"), *args], cwd=cwd, env=clean, capture_output=True,
                          text=True, timeout=timeout)


def test_the_wheel_and_the_sdist_carry_everything(dist):
    names = zipfile.ZipFile(next(dist.glob("fsdpctl-*.whl"))).namelist()
    for needed in ("fsdpctl/_data/templates/torchrun.sh.j2", "fsdpctl/_data/cluster_profiles/local.yaml",
                   "fsdpctl/web/static/index.html", "fsdpctl/web/static/app.js",
                   "fsdpctl/node/startup/sitecustomize.py", "fsdpctl/node/telemetry/reporter.py"):
        assert needed in names, needed
    assert any(n.startswith("fsdpctl/web/static/vendor/uplot/") for n in names)
    with tarfile.open(next(dist.glob("fsdpctl-*.tar.gz"))) as sdist:
        members = sdist.getnames()
    assert any(m.endswith("/templates/sbatch.sh.j2") for m in members) and any(m.endswith("/docs/index.md")
                                                                            for m in members)


def test_installed_it_plans_trains_serves_and_reports_far_from_the_repository(installed, tmp_path):
    where = use(installed, tmp_path, "--version")
    assert where.returncode == 0 and re.match(r"fsdpctl \d", where.stdout)
    python = installed[0] / "python"
    origin = subprocess.run([str(python), "-c", "import fsdpctl; print(fsdpctl.__file__)"], cwd=tmp_path,
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert "site-packages" in origin.stdout and str(REPO) not in origin.stdout, origin.stdout
    assert use(installed, tmp_path, "--help").returncode == 0
    listing = use(installed, tmp_path, "profiles")
    assert listing.returncode == 0 and "local" in listing.stdout and "_data/cluster_profiles" in listing.stdout
    dry = use(installed, tmp_path, "launch", "-p", "local", "--dry-run")
    assert dry.returncode == 0 and "node0.sh" in dry.stdout, dry.stderr
    trained = use(installed, tmp_path, "launch", "-p", "local", "--steps", "5", "--no-preflight",
                  "--profile-steps", "3-4", timeout=600)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "| step=5 loss=" in trained.stdout and "succeeded" in trained.stderr
    # the bundled workload's steps 3-4 profiled on both ranks and merged, by the installed package alone
    profiled = re.search(r"profile launch-attempt1 of run (\S+): steps 3-4 on rank\(s\) 0, 1", trained.stdout)
    assert profiled, trained.stdout[-3000:]
    folder = tmp_path / "runs" / profiled.group(1) / "profiles" / "launch-attempt1"
    summary = json.loads((folder / "summary.json").read_text())
    assert [r["steps"] for r in summary["ranks"]] == [[3, 4], [3, 4]] and (folder / "trace.json.gz").exists()
    report = use(installed, tmp_path, "report", "--html", str(tmp_path / "report.html"))
    assert report.returncode == 0 and "uPlot" in (tmp_path / "report.html").read_text(), report.stderr
    assert summary["verdict"] in use(installed, tmp_path, "report").stdout
    completed = use(installed, tmp_path, env={"_FSDPCTL_COMPLETE": "complete_bash",
                                              "COMP_WORDS": "fsdpctl logs ", "COMP_CWORD": "2"})
    assert completed.stdout.split() and completed.stdout.split()[0].startswith("local-")

    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = subprocess.Popen([str(installed[0] / "fsdpctl"), "dashboard", "--port", "0", "--runs-dir",
                               str(tmp_path / "runs")], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**clean, "HOME": str(tmp_path)})
    try:
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())  # the token's cookie
        page = browser.open(url, timeout=30).read().decode()
        assert "/static/uplot.js" in page
        base = url.split("/?")[0].split("#")[0].rstrip("/")
        chart = browser.open(f"{base}/static/uplot.js", timeout=30).read()
        assert len(chart) > 10_000
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_plain_install_answers_every_command_in_its_own_words(plain, tmp_path):
    listed = subprocess.run([str(plain[0] / "python"), "-c", "from fsdpctl.cli.reference import commands; "
                             "print(' '.join(commands()))"], cwd=tmp_path, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"}, timeout=60)
    names = listed.stdout.split()
    assert listed.returncode == 0 and {"launch", "doctor", "report"} <= set(names), listed.stderr
    for args in (["--version"], ["--help"], *([name, "--help"] for name in names)):
        helped = use(plain, tmp_path, *args, timeout=60)
        assert helped.returncode == 0 and helped.stdout.strip(), (args, helped.stderr[-3000:])
        assert "Traceback" not in helped.stdout + helped.stderr, (args, helped.stderr[-3000:])

    # getting started's first command: no torch here, so no training; fsdpctl's own error says what is missing
    launched = use(plain, tmp_path, "launch", "-p", "local", "--steps", "3", timeout=300)
    said = launched.stdout + launched.stderr
    assert "Traceback" not in said, said[-5000:]
    python = plain[0] / "python"
    assert launched.returncode == 1, said[-3000:]
    assert f"torch is not installed for {python}" in launched.stdout, said[-3000:]
    assert f"{python} -m pip install numpy tokenizers" in launched.stdout, said[-3000:]
    last = launched.stderr.strip().splitlines()[-2:]
    assert last[0] == "error: preflight failed; nothing was started", said[-3000:]
    assert last[1].startswith("  hint: fix what the report names (localhost: torch, packages)"), said[-3000:]
    assert not list(tmp_path.glob("runs/*/run.json"))
