"""The Slurm batch script and its pieces, rendered from a plan's Slurm part (templates in ``templates/``)."""

from __future__ import annotations

from pathlib import Path

from ...plan.render import render_template, render_text
from ...plan.types import LaunchPlan
from .plan import SlurmPlan

SBATCH_TEMPLATE = "sbatch.sh.j2"
SUBMITIT_SETUP_TEMPLATE = "submitit_setup.sh.j2"
SLURM_HEAD_TEMPLATE = "slurm_head.sh.j2"
SBATCH_SCRIPT = "sbatch.sh"
SUBMITIT_SETUP_SCRIPT = "submitit-setup.sh"


def render_sbatch_script(plan: LaunchPlan, template_dir: Path | None = None) -> str:
    """The batch script for ``sbatch``: directives, then one torchrun per node through ``srun``."""
    return render_template(SBATCH_TEMPLATE, plan, template_dir, slurm=SlurmPlan.of(plan))


def render_submitit_setup(plan: LaunchPlan, template_dir: Path | None = None) -> str:
    """The lines submitit's batch script runs before its ``srun`` (environment, head address)."""
    return render_template(SUBMITIT_SETUP_TEMPLATE, plan, template_dir, slurm=SlurmPlan.of(plan))


def render_slurm_head(template_dir: Path | None = None) -> str:
    """Shell lines, run inside an allocation, that set ``head_node`` and export ``FSDPCTL_HEAD_ADDR``
    (the first node's address as Slurm knows it); the batch preamble includes the same lines."""
    return render_text(SLURM_HEAD_TEMPLATE, template_dir)


def slurm_scripts(plan: LaunchPlan, template_dir: Path | None = None) -> dict[str, str]:
    """``sbatch.sh``, or for ``--via submitit`` ``submitit-setup.sh`` (the setup lines of submitit's own
    batch script)."""
    if SlurmPlan.of(plan).via == "submitit":
        return {SUBMITIT_SETUP_SCRIPT: render_submitit_setup(plan, template_dir)}
    return {SBATCH_SCRIPT: render_sbatch_script(plan, template_dir)}
