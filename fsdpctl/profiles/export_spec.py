"""What a profile's ``export`` section may say: where a run's numbers go, with no line of user code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

WandbMode = Literal["online", "offline", "disabled"]


@dataclass(frozen=True, kw_only=True)
class WandbSpec:
    """Weights & Biases for every rank: the variables wandb reads (``WANDB_PROJECT``, ``WANDB_ENTITY``,
    ``WANDB_MODE``, ``WANDB_RUN_GROUP`` = the run id), so every rank's ``wandb.init()`` joins one group;
    the bundled workload logs its losses, throughput and per-rank times there itself (rank 0). The nodes
    need the ``wandb`` package (the preflight checks); its key goes in ``secrets: [WANDB_API_KEY]``."""

    project: str
    """The W&B project."""
    entity: Optional[str] = None
    """The team or user; default: the key's own."""
    mode: WandbMode = "online"
    """online, offline (files in ``WANDB_DIR`` under the run directory, ``wandb sync`` later) or disabled."""


@dataclass(frozen=True, kw_only=True)
class MlflowSpec:
    """MLflow for every rank: a parent run made for the run at launch (named after it, tagged
    ``fsdpctl.run_id``), its id in ``FSDPCTL_MLFLOW_PARENT_RUN_ID`` with ``MLFLOW_TRACKING_URI`` and
    ``MLFLOW_EXPERIMENT_NAME`` for every rank, so a rank's own run nests under it (tag
    ``mlflow.parentRunId``); the bundled workload logs there itself (rank 0). Needs ``mlflow`` (or
    ``mlflow-skinny``) here and on the nodes."""

    tracking_uri: str
    """Where MLflow keeps runs (``http://mlflow:5000``, ``file:///shared/mlruns``), as every node reaches it."""
    experiment: str = "fsdpctl"
    """The experiment the runs go in (made when missing)."""


@dataclass(frozen=True, kw_only=True)
class ExportSpec:
    """Where every run's numbers go live, written by the process that follows the run (the launcher,
    or a detached run's follower) from what it brings back: no line of user code. ``--tensorboard``
    and ``--prometheus`` give or override the first two for one launch."""

    tensorboard: Optional[str] = None
    """A folder on this machine: each run writes TensorBoard event files into ``<folder>/<run_id>/``
    (losses, tokens/s, MFU, time per step, each rank's compute / collective / data time by step; each
    GPU's SM clock, utilisation, temperature, power and memory by seconds since the run began)."""
    prometheus: Optional[str] = None
    """A file (or a folder: ``fsdpctl_<run_id>.prom`` in it) for node_exporter's textfile collector,
    replaced atomically every 15 s while the run goes: DCGM-Exporter's GPU metric names
    (``DCGM_FI_DEV_SM_CLOCK``...) with ``run``, ``host``, ``node`` and ``gpu`` labels, and fsdpctl's
    own (``fsdpctl_step``, ``fsdpctl_loss``...). Removed when the run ends."""
    wandb: Optional[WandbSpec] = None
    """Weights & Biases for every rank (see its fields)."""
    mlflow: Optional[MlflowSpec] = None
    """MLflow for every rank (see its fields)."""
