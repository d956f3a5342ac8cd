"""Render the node script and the Slurm batch script from a plan. The only jinja2 importer.

Templates only substitute: every value is computed by the plan and every value is quoted here
(``q``, ``qpath``, ``qjoin``), so a profile value can never become shell code.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import jinja2

from ..resources import shipped_dir
from ..shell import NodeExpr, quote_path, shell_join
from ..workload.config import REQUEUE_MARKER
from .types import LaunchPlan, NodeSpec

NODE_TEMPLATE = "torchrun.sh.j2"
SBATCH_TEMPLATE = "sbatch.sh.j2"
SUBMITIT_SETUP_TEMPLATE = "submitit_setup.sh.j2"
SLURM_HEAD_TEMPLATE = "slurm_head.sh.j2"


def _environment(template_dir: Path) -> jinja2.Environment:
    # Shell scripts, not HTML: autoescape would be wrong; the q/qpath/qjoin filters quote instead.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # noqa: S701
    )
    # A NodeExpr (a value that must expand on the node, e.g. PYTHONPATH under "$FSDPCTL_RUN_DIR")
    # was quoted by the plan, word by word: written as it is.
    env.filters["q"] = lambda value: value if isinstance(value, NodeExpr) else shlex.quote(str(value))
    env.filters["qpath"] = quote_path
    env.filters["qjoin"] = shell_join
    return env


def _context(plan: LaunchPlan) -> dict[str, Any]:
    # requeue_marker is the workload's own file name (a constant, never profile text): the one
    # value written unquoted, inside the script's double quotes.
    return {"plan": plan, "env": plan.env, "setup": plan.setup, "requeue_marker": REQUEUE_MARKER}


def render_node_script(plan: LaunchPlan, node: NodeSpec, template_dir: Path | None = None) -> str:
    """The bash script one node runs: environment, then ``exec`` torchrun for the workload."""
    env = _environment(template_dir or shipped_dir("templates"))
    return env.get_template(NODE_TEMPLATE).render(**_context(plan), node=node)


def render_sbatch_script(plan: LaunchPlan, template_dir: Path | None = None) -> str:
    """The batch script for ``sbatch``: directives, then one torchrun per node through ``srun``."""
    if plan.slurm is None:
        raise ValueError("render_sbatch_script needs a plan made with for_slurm=True")
    env = _environment(template_dir or shipped_dir("templates"))
    return env.get_template(SBATCH_TEMPLATE).render(**_context(plan), slurm=plan.slurm)


def render_slurm_head(template_dir: Path | None = None) -> str:
    """Shell lines, run inside an allocation, that set ``head_node`` and export ``FSDPCTL_HEAD_ADDR``
    (the first node's address as Slurm knows it); the batch preamble includes the same lines."""
    env = _environment(template_dir or shipped_dir("templates"))
    return env.get_template(SLURM_HEAD_TEMPLATE).render()


def render_submitit_setup(plan: LaunchPlan, template_dir: Path | None = None) -> str:
    """The lines submitit's batch script runs before its ``srun`` (environment, head address)."""
    env = _environment(template_dir or shipped_dir("templates"))
    return env.get_template(SUBMITIT_SETUP_TEMPLATE).render(**_context(plan), slurm=plan.slurm)


def render_all(plan: LaunchPlan, template_dir: Path | None = None) -> dict[str, str]:
    """Every script of the plan by file name: ``node<R>.sh`` per node, ``sbatch.sh``, or for
    ``--via submitit`` ``submitit-setup.sh`` (the setup lines of submitit's own batch script)."""
    if plan.slurm is not None and plan.slurm.via == "submitit":
        return {"submitit-setup.sh": render_submitit_setup(plan, template_dir)}
    if plan.slurm is not None:
        return {"sbatch.sh": render_sbatch_script(plan, template_dir)}
    return {f"node{n.node_rank}.sh": render_node_script(plan, n, template_dir) for n in plan.nodes}
