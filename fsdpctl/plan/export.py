"""The plan's exports: where the run's numbers go (``export`` in the profile, ``--tensorboard`` and
``--prometheus``), the variables every rank gets for W&B and MLflow, and what the nodes then need.
Pure, like the rest of the plan: paths are resolved against the launching folder, nothing is read."""

from __future__ import annotations

import posixpath
from typing import Any, Optional

from ..profiles.export_spec import ExportSpec
from ..shell import NodeExpr

PARENT_RUN_ENV = "FSDPCTL_MLFLOW_PARENT_RUN_ID"
"""Every rank's MLflow parent run (made for the run at launch)."""
LOG_TO_ENV = "FSDPCTL_LOG_TO"
"""What the bundled workload logs to besides its own files (``wandb,mlflow``)."""
PROMETHEUS_SUFFIX = ".prom"


def _absolute(path: str, local_cwd: str, home: str) -> str:
    path = home + path[1:] if path == "~" or path.startswith("~/") else path
    return posixpath.normpath(posixpath.join(local_cwd, path))


def export_plan(spec: ExportSpec, *, tensorboard: Optional[str], prometheus: Optional[str], run_id: str,
                local_cwd: str, home: str, bundled: bool) -> tuple[dict[str, Any], dict[str, str], tuple[str, ...]]:
    """(the plan's ``export``, variables for every rank, requirements on the nodes). ``tensorboard``
    and ``prometheus``: the flags' (over the profile's)."""
    export: dict[str, Any] = {}
    env: dict[str, str] = {}
    requirements: list[str] = []
    if tensorboard or spec.tensorboard:
        export["tensorboard"] = posixpath.join(_absolute(tensorboard or spec.tensorboard, local_cwd, home), run_id)
    if prometheus or spec.prometheus:
        where = _absolute(prometheus or spec.prometheus, local_cwd, home)
        export["prometheus"] = where if where.endswith(PROMETHEUS_SUFFIX) else \
            posixpath.join(where, f"fsdpctl_{run_id}{PROMETHEUS_SUFFIX}")
    log_to = []
    if spec.wandb is not None:
        export["wandb"] = {"project": spec.wandb.project, "entity": spec.wandb.entity, "mode": spec.wandb.mode}
        env.update({"WANDB_PROJECT": spec.wandb.project, "WANDB_RUN_GROUP": run_id, "WANDB_MODE": spec.wandb.mode,
                    "WANDB_DIR": NodeExpr('"$FSDPCTL_RUN_DIR"')})
        if spec.wandb.entity:
            env["WANDB_ENTITY"] = spec.wandb.entity
        log_to.append("wandb")
    if spec.mlflow is not None:
        export["mlflow"] = {"tracking_uri": spec.mlflow.tracking_uri, "experiment": spec.mlflow.experiment}
        env.update({"MLFLOW_TRACKING_URI": spec.mlflow.tracking_uri,
                    "MLFLOW_EXPERIMENT_NAME": spec.mlflow.experiment})
        log_to.append("mlflow")
    if log_to and bundled:  # the bundled workload logs there itself; a program of yours decides for itself
        env[LOG_TO_ENV] = ",".join(log_to)
        requirements += ["wandb" if name == "wandb" else "mlflow-skinny" for name in log_to]
    return export, env, tuple(requirements)
