"""Profile and job fields that nothing else tried, each doing what docs/profiles.md says it does."""

from __future__ import annotations

import sys
from pathlib import Path

from fsdpctl.backends import plan_run, render_scripts
from fsdpctl.plan.types import Overrides
from fsdpctl.profiles.jobs import load_job
from fsdpctl.profiles.loader import load_profile
from tests.conftest import run_cli

PROFILE = """\
name: fields
hosts: [a, b]
python: /opt/venv/bin/python
health:
  allow_busy_gpus: true
container:
  image: registry.example/train:1
  memlock: {memlock}
export:
  wandb:
    project: fsdp
    entity: my-team
slurm:
  partition: gpu
  account: proj-42
  qos: high
train:
  grad_clip: 0.5
  keep_checkpoints: 3
  memory_report: true
  min_lr: 1.0e-5
  rank_timing: false
  warmup_steps: 7
  weight_decay: 0.05
"""


def plan(tmp_path: Path, memlock: str = "true", backend: str | None = None):
    path = tmp_path / f"fields-{memlock}.yaml"
    path.write_text(PROFILE.format(memlock=memlock))
    options = {"backend": backend} if backend else {}
    return plan_run(load_profile(str(path)).profile, run_id="fields-20261127-120000-abcd", local_run_dir="r",
                    local_python=sys.executable, home="/home/me", local_cwd="/home/me", overrides=Overrides(),
                    **options)


def test_the_bundled_workloads_settings_reach_every_rank(tmp_path):
    made = plan(tmp_path)
    entry = " ".join(made.entry)
    for flag in ("--grad-clip 0.5", "--keep-checkpoints 3", "--memory-report", "--min-lr 1e-05",
                 "--no-rank-timing", "--warmup-steps 7", "--weight-decay 0.05"):
        assert flag in entry, (flag, entry)


def test_health_export_and_container_fields_reach_the_plan_and_the_node_script(tmp_path):
    made = plan(tmp_path)
    assert made.allow_busy_gpus is True  # the preflight then only warns of another process on a GPU
    assert made.env["WANDB_ENTITY"] == "my-team" and made.env["WANDB_PROJECT"] == "fsdp"
    script = render_scripts(made)["node0.sh"]
    assert "--ulimit memlock=-1:-1" in script  # where the host allows it
    assert "memlock" not in render_scripts(plan(tmp_path, memlock="false"))["node0.sh"]


def test_slurm_account_and_qos_are_directives_of_the_batch_script(tmp_path):
    script = render_scripts(plan(tmp_path, backend="slurm"))["sbatch.sh"]
    assert "#SBATCH --account=proj-42" in script and "#SBATCH --qos=high" in script


def test_a_jobs_code_limit_refuses_a_larger_folder(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "big.yaml").write_text("name: big\ncommand: [train.py]\ncode: ..\ncode_limit_mb: 1\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "weights.bin").write_bytes(b"\0" * (2 << 20))
    assert load_job(str(tmp_path / "jobs" / "big.yaml")).job.code_limit_mb == 1
    refused = run_cli("launch", "--job", str(tmp_path / "jobs" / "big.yaml"), "-p", "two-node", "--dry-run",
                      cwd=tmp_path)
    assert refused.returncode == 2 and "weights.bin" in refused.stderr and "1 MB" in refused.stderr, refused.stderr
