"""Render a plan's scripts from the templates (the node script; a backend's own, such as a batch
script, through ``render_template``). The only jinja2 importer.

Templates only substitute: every value is computed by the plan and every value is quoted here
(``q``, ``qpath``, ``qjoin``), so a profile value can never become shell code.
"""

from __future__ import annotations

import functools
import shlex
from pathlib import Path
from typing import Any

import jinja2

from ..resources import shipped_dir
from ..shell import NodeExpr, quote_path, shell_join
from ..workload.config import REQUEUE_MARKER
from .types import LaunchPlan, NodeSpec

NODE_TEMPLATE = "torchrun.sh.j2"


@functools.lru_cache(maxsize=8)
def _environment(template_dir: Path) -> jinja2.Environment:
    # One per folder, kept: it keeps each template compiled (a new one per node compiled the node
    # script's template again for every node, 0.1 s each: two minutes of a 1,024-node launch).
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


def render_text(name: str, template_dir: Path | None = None, **context: Any) -> str:
    """The template ``name`` rendered with ``context`` alone."""
    return _environment(template_dir or shipped_dir("templates")).get_template(name).render(**context)


def render_template(name: str, plan: LaunchPlan, template_dir: Path | None = None, **context: Any) -> str:
    """The template ``name`` rendered for ``plan`` (a backend's own templates too: the plan, its
    environment and setup lines are always there, ``context`` adds the rest)."""
    return render_text(name, template_dir, **_context(plan), **context)


def container_context(plan: LaunchPlan, node: NodeSpec) -> dict[str, Any] | None:
    """What the node script needs to start its second half inside the image (None: no container)."""
    container = plan.container
    if container is None:
        return None
    from ..container import runtime

    names = [*plan.env, *node.env, "FSDPCTL_RUN_DIR", "FSDPCTL_NODE_RANK", "FSDPCTL_HOST", *plan.secrets]
    name = runtime.container_name(plan.run_id, node.node_rank, plan.attempt)
    labels = {runtime.LABEL_RUN: plan.run_id, runtime.LABEL_NODE: str(node.node_rank)}
    chdir = None if container.workdir else plan.chdir
    return {"runtime": container.runtime, "image": container.image, "name": name,
            "run": runtime.run_words(container, name=name, labels=labels, env_names=list(dict.fromkeys(names)),
                                     chdir=chdir),
            "gpu": runtime.gpu_flags(container), "ib": runtime.ib_flags(container),
            "memlock": container.memlock and container.runtime in runtime.DAEMON_RUNTIMES,
            "user": runtime.user_flags(container), "workdir": container.workdir, "data_cache": runtime.DATA_CACHE}


def render_node_script(plan: LaunchPlan, node: NodeSpec, template_dir: Path | None = None) -> str:
    """The bash script one node runs: environment, then ``exec`` torchrun for the workload (with a
    container: the host's half starts the image, whose half runs torchrun)."""
    return render_template(NODE_TEMPLATE, plan, template_dir, node=node, container=container_context(plan, node))


def render_node_scripts(plan: LaunchPlan, template_dir: Path | None = None) -> dict[str, str]:
    """``node<R>.sh`` for every node of the plan."""
    return {f"node{n.node_rank}.sh": render_node_script(plan, n, template_dir) for n in plan.nodes}
