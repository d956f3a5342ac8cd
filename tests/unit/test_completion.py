"""Shell completion, as bash and zsh ask for it (Typer's completion variables): the profiles, run ids,
a profile's hosts and a run's ranks that exist here, and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture
def place(tmp_path: Path) -> Path:
    (tmp_path / "cluster_profiles").mkdir()
    (tmp_path / "cluster_profiles" / "lab.yaml").write_text(
        "name: lab\nhosts:\n  - host: gpu-a\n  - host: gpu-b\n    address: 10.0.0.2\nspares:\n  - host: gpu-c\n")
    for run_id, world in (("lab-20261127-100000-aaaa", 4), ("lab-20261127-110000-bbbb", 2)):
        run = tmp_path / "runs" / run_id
        run.mkdir(parents=True)
        (run / "plan.json").write_text(json.dumps({"run_id": run_id, "world_size": world,
                                                   "nodes": [{"host": "gpu-a"}, {"host": "gpu-b"}]}))
    (tmp_path / "runs" / "not-a-run").mkdir()
    return tmp_path


def complete(place: Path, words: str, shell: str = "bash") -> list[str]:
    env = {**os.environ, "_FSDPCTL_COMPLETE": f"complete_{shell}", "FSDPCTL_RUNS_DIR": str(place / "runs"),
           "HOME": str(place), "XDG_CONFIG_HOME": str(place / ".config"), "PYTHONPATH": str(REPO)}
    if shell == "bash":
        env.update(COMP_WORDS=words, COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)))
    else:
        env.update(_TYPER_COMPLETE_ARGS=words, _TYPER_COMPLETE_FISH_ACTION="get-args")
    done = subprocess.run([sys.executable, "-m", "fsdpctl"], env=env, cwd=place, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_profiles_runs_hosts_and_ranks_complete_from_what_exists(place):
    assert {"lab", "local", "two-node", "slurm"} <= set(complete(place, "fsdpctl launch -p "))
    assert complete(place, "fsdpctl doctor --profile la") == ["lab"]
    # newest run first; a folder without a plan is no run
    assert complete(place, "fsdpctl logs ") == ["lab-20261127-110000-bbbb", "lab-20261127-100000-aaaa"]
    assert complete(place, "fsdpctl report lab-20261127-10") == ["lab-20261127-100000-aaaa"]
    assert complete(place, "fsdpctl logs lab-20261127-100000-aaaa --rank ") == ["0", "1", "2", "3"]
    assert complete(place, "fsdpctl top --rank ") == ["0", "1"]  # the newest run's
    assert complete(place, "fsdpctl launch -p lab --exclude ") == ["gpu-a", "gpu-b", "gpu-c"]
    assert complete(place, "fsdpctl logs lab-20261127-100000-aaaa --host gpu-") == ["gpu-a", "gpu-b"]


def test_zsh_and_fish_get_the_same_answers(place):
    said = " ".join(complete(place, "fsdpctl launch -p la", shell="zsh"))
    assert '"lab"' in said and "local" not in said
    assert complete(place, "fsdpctl launch -p la", shell="fish") == ["lab"]
