"""A run's MLflow parent run: made by the launcher at launch in the profile's experiment, named after
the fsdpctl run and tagged with it, so every rank's own run nests under one parent; its status set
when the run ends. The only module on the launcher's side that imports mlflow, and only when called:
``fsdpctl --help`` and runs without ``export.mlflow`` never load it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, TypeVar

from ..errors import FsdpctlError, UsageError, one_line

RUN_ID_TAG = "fsdpctl.run_id"
PROFILE_TAG = "fsdpctl.profile"
BACKEND_TAG = "fsdpctl.backend"
INSTALL = "pip install mlflow-skinny"
MAKE_SECONDS = 60.0
"""How long a launch waits for the tracking server to make (or find) the parent run."""
STATUS_SECONDS = 20.0
"""How long the end of a run waits for the tracking server to take the parent's status."""

Status = Literal["RUNNING", "FINISHED", "FAILED", "KILLED"]
T = TypeVar("T")


def parent_run(*, tracking_uri: str, experiment: str, run_id: str, profile: str, backend: str,
               timeout: float = MAKE_SECONDS) -> str:
    """The id of the MLflow run that stands for fsdpctl run ``run_id`` in ``experiment`` (made when
    missing): the one already tagged ``fsdpctl.run_id`` = ``run_id`` when there is one (a later
    attempt of the same run; set running again), else a new run named ``run_id``. UsageError when
    mlflow is not installed here; FsdpctlError, in one line, when the tracking server refuses or
    does not answer within ``timeout`` seconds."""
    client_class = _client_class()

    def make() -> str:
        client = client_class(tracking_uri=tracking_uri)  # a store it refuses raises here already
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
        # Backquotes: a tag key with a dot in it is otherwise read as a path.
        earlier = client.search_runs([experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'",
                                     max_results=1)
        if earlier:
            parent = earlier[0].info
            if parent.status != "RUNNING":
                client.update_run(parent.run_id, status="RUNNING")
            return parent.run_id
        tags = {RUN_ID_TAG: run_id, PROFILE_TAG: profile, BACKEND_TAG: backend}
        return client.create_run(experiment_id, tags=tags, run_name=run_id).info.run_id

    try:
        return _bounded(make, timeout)
    except Exception as exc:  # noqa: BLE001 - mlflow, requests and a timeout each raise their own
        raise FsdpctlError(f"export.mlflow: could not make run {run_id}'s parent run in experiment {experiment!r} "
                           f"at {tracking_uri}: {_said(exc)}", _hint(exc, tracking_uri)) from None


def set_status(tracking_uri: str, parent_id: str, status: Status, *, timeout: float = STATUS_SECONDS) -> None:
    """Set the parent run's status (``RUNNING`` again for a later attempt; ``FINISHED``, ``FAILED``
    or ``KILLED`` with its end time once the run is over). FsdpctlError in one line when mlflow is
    missing, or the server refuses or does not answer within ``timeout`` seconds."""
    client_class = _client_class()

    def change() -> None:
        client = client_class(tracking_uri=tracking_uri)
        if status == "RUNNING":
            client.update_run(parent_id, status="RUNNING")
        else:
            client.set_terminated(parent_id, status)

    try:
        _bounded(change, timeout)
    except Exception as exc:  # noqa: BLE001 - as in parent_run
        raise FsdpctlError(f"export.mlflow: could not set parent run {parent_id} {status} at {tracking_uri}: "
                           f"{_said(exc)}", _hint(exc, tracking_uri)) from None


def _client_class() -> type:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise UsageError(f"export.mlflow: the profile asks for MLflow and mlflow is not installed here ({exc})",
                         f"{INSTALL} (here and on every node), or drop export.mlflow") from None
    return MlflowClient


def _bounded(fn: Callable[[], T], seconds: float) -> T:
    """``fn()`` in a thread of its own, waited for ``seconds`` at most: MLflow's HTTP client retries
    a server that does not answer for minutes, longer than a launch or the end of a run should wait.
    A daemon thread, so one left retrying never holds this process open."""
    result: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    worker = threading.Thread(target=body, name="fsdpctl-mlflow", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer in {seconds:g} s")
    if failure:
        raise failure[0]
    return result[0]


def _said(exc: BaseException) -> str:
    """What went wrong in one short line (MLflow's messages run to paragraphs)."""
    text = one_line(" ".join(str(exc).split())) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _hint(exc: BaseException, tracking_uri: str) -> str:
    if "MLFLOW_ALLOW_FILE_STORE" in str(exc):
        return ("this MLflow refuses a file:// store unless MLFLOW_ALLOW_FILE_STORE=true is set, here and in the "
                "profile's env; or give a tracking server (http://...)")
    return f"check that {tracking_uri} answers from this machine (and from the nodes), or drop export.mlflow"
