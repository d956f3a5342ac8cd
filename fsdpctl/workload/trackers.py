"""Rank 0's numbers sent on to Weights & Biases and MLflow, besides metrics.jsonl, when
``FSDPCTL_LOG_TO`` names them (``wandb,mlflow``). The launcher sets it from the profile's ``export``
section, with the variables each client reads for itself: ``WANDB_PROJECT``, ``WANDB_RUN_GROUP`` (the
fsdpctl run id), ``WANDB_MODE``, ``WANDB_DIR``; ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME`` and
``FSDPCTL_MLFLOW_PARENT_RUN_ID``, the parent run it made for the whole run.

Every train row (loss, lr, tokens/s, MFU, time per step, gradient norm, memory, each rank's compute,
collective and data time as ``rank{R}/compute_s``...) and every validation row goes to both at its step;
the settings are W&B's config and MLflow's params. A tracker that cannot be imported or started ends the
run at its start, in one line naming the fix; one that fails later says so once and training goes on.

Standard library only until a tracker is asked for: ``wandb`` and ``mlflow`` are imported then, on
rank 0 only.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional

from .config import ConfigError

# fsdpctl.plan.export's names: the workload package travels to the nodes without the rest of fsdpctl.
LOG_TO_ENV = "FSDPCTL_LOG_TO"
PARENT_RUN_ENV = "FSDPCTL_MLFLOW_PARENT_RUN_ID"
TRAIN_KEYS = ("loss", "lr", "tokens_per_s", "mfu", "step_time_s", "grad_norm", "mem_mb")
RANK_KEYS = ("compute_s", "comm_s", "data_s")
VAL_KEYS = ("val_loss", "val_perplexity")
INSTALL = {"wandb": "pip install wandb", "mlflow": "pip install mlflow-skinny"}


def requested(env: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The trackers ``FSDPCTL_LOG_TO`` names, in its order; ConfigError for a name it does not know."""
    names = tuple(dict.fromkeys(n.strip() for n in env.get(LOG_TO_ENV, "").split(",") if n.strip()))
    unknown = [n for n in names if n not in INSTALL]
    if unknown:
        raise ConfigError(LOG_TO_ENV, f"{', '.join(unknown)}: not a tracker the workload knows",
                          f"name {' and/or '.join(INSTALL)}")
    return names


def metrics_of(row: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics.jsonl row that a tracker gets (those the row has a value for)."""
    if row.get("kind") == "val":
        return {k: float(row[k]) for k in VAL_KEYS if row.get(k) is not None}
    numbers = {k: float(row[k]) for k in TRAIN_KEYS if row.get(k) is not None}
    for rank in row.get("ranks") or ():
        numbers.update({f"rank{rank['rank']}/{k}": float(rank[k]) for k in RANK_KEYS if rank.get(k) is not None})
    return numbers


class _Wandb:
    name = "wandb"

    def __init__(self, settings: dict[str, Any], run_name: str):
        import wandb

        # Project, group, mode, entity and folder come from the WANDB_* variables the launcher set.
        self.run = wandb.init(name=run_name, config=settings)

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.run.log(numbers, step=step)

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class _Mlflow:
    name = "mlflow"

    def __init__(self, settings: dict[str, Any], run_name: str, attempt: str):
        import mlflow

        self.mlflow = mlflow
        parent = os.environ.get(PARENT_RUN_ENV)
        tags = {"fsdpctl.rank": "0", "fsdpctl.attempt": attempt}
        options: dict[str, Any] = {}
        if parent:
            # The parent's experiment, whatever MLFLOW_EXPERIMENT_NAME says: a child sits beside its parent.
            options["experiment_id"] = mlflow.MlflowClient().get_run(parent).info.experiment_id
            if "parent_run_id" in inspect.signature(mlflow.start_run).parameters:
                options["parent_run_id"] = parent
            else:  # an MLflow older than start_run(parent_run_id=...): the tag is what nests a run
                tags["mlflow.parentRunId"] = parent
        self.run = mlflow.start_run(run_id=None, run_name=run_name, nested=True, tags=tags, **options)
        try:
            mlflow.log_params({k: "" if v is None else v for k, v in settings.items()})
        except BaseException:
            mlflow.end_run(status="FAILED")
            raise

    def log(self, numbers: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(numbers, step=step)

    def finish(self, status: str) -> None:
        self.mlflow.end_run(status=status)


class Trackers:
    """The trackers of this process: none until ``start`` (rank 0 only); every method a no-op
    without any, so the training loop calls them unconditionally."""

    def __init__(self, names: Optional[Sequence[str]] = None):
        """``names``: the trackers to start (default: what ``FSDPCTL_LOG_TO`` names, read by ``start``)."""
        self.names = tuple(names) if names is not None else None
        self.live: list[Any] = []

    def start(self, settings: dict[str, Any]) -> None:
        """Import and start every tracker asked for, the run's settings as its config / params; a
        ConfigError naming the fix when one cannot be imported or started (the run ends there)."""
        run_id = os.environ.get("FSDPCTL_RUN_ID") or "fsdpctl"
        attempt = os.environ.get("FSDPCTL_ATTEMPT") or "1"
        # A later attempt is a run of its own in the same group / under the same parent.
        run_name = f"{run_id}-rank0" if attempt == "1" else f"{run_id}-rank0-attempt{attempt}"
        for name in self.names if self.names is not None else requested():
            try:
                self.live.append(_Wandb(settings, run_name) if name == "wandb" else
                                 _Mlflow(settings, run_name, attempt))
            except ImportError as exc:
                self.finish("FAILED")
                raise ConfigError(f"export.{name}", f"the run logs to {name} and it cannot be imported on this "
                                  f"node ({exc})", f"{INSTALL[name]} on every node (or drop export.{name})") from None
            except Exception as exc:  # noqa: BLE001 - each client raises its own kinds
                self.finish("FAILED")
                raise ConfigError(f"export.{name}", f"{name} could not start a run ({_said(exc)})",
                                  _fix(name)) from None

    def log(self, row: Mapping[str, Any]) -> None:
        """Send a metrics.jsonl row (train or validation) at its step. A tracker that fails is said
        once and dropped: training goes on."""
        numbers = metrics_of(row)
        if not numbers:
            return
        for tracker in list(self.live):
            try:
                tracker.log(numbers, int(row["step"]))
            except Exception as exc:  # noqa: BLE001 - a tracker never stops training
                self.live.remove(tracker)
                _say(f"{tracker.name}: logging failed at step {row['step']} ({_said(exc)}), "
                     f"training goes on without it")

    def finish(self, status: str) -> None:
        """End every tracker's run: ``FINISHED``, ``FAILED`` or ``KILLED`` (W&B: exit code 0 or 1)."""
        while self.live:
            tracker = self.live.pop()
            try:
                tracker.finish(status)
            except Exception as exc:  # noqa: BLE001 - the run's own end matters more
                _say(f"{tracker.name}: could not end its run ({_said(exc)})")

    @contextlib.contextmanager
    def ended_on_error(self) -> Iterator[Trackers]:
        """Whatever leaves the block by an exception ends the trackers' runs first: KILLED for an
        interrupt, else FAILED (left alone, MLflow's exit hook would call a crashed run FINISHED)."""
        try:
            yield self
        except BaseException as exc:
            self.finish("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
            raise


def _said(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _fix(name: str) -> str:
    if name == "wandb":
        return ("online: give the key as a secret (secrets: [WANDB_API_KEY]) and check the nodes reach W&B; "
                "or set export.wandb.mode: offline")
    return "check that MLFLOW_TRACKING_URI answers from the nodes, or drop export.mlflow"


def _say(text: str) -> None:
    print(f"fsdpctl.workload: {text}", file=sys.stderr, flush=True)
