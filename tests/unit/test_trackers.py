"""The bundled workload's trackers (W&B, MLflow) without their clients: what a row sends, a tracker
that fails while logging said once and dropped while training goes on, every tracker's run ended with
how the process ends, and a tracker that cannot be imported refused in one line naming the fix."""

from __future__ import annotations

import sys

import pytest

from fsdpctl.workload.config import ConfigError
from fsdpctl.workload.trackers import Trackers, metrics_of, requested

TRAIN = {"kind": "train", "step": 4, "epoch": 1, "loss": 6.5, "lr": 1e-4, "tokens_per_s": 1200.0, "mfu": None,
         "mem_mb": 512.0, "grad_norm": 2.5, "step_time_s": 0.25, "time": 1.0, "straggler": None,
         "ranks": [{"rank": 0, "host": "a", "compute_s": 0.1, "comm_s": 0.05, "data_s": 0.01, "wall_s": 0.2},
                   {"rank": 1, "host": "b", "compute_s": 0.12, "comm_s": 0.04, "data_s": 0.02, "wall_s": 0.2}]}
VAL = {"kind": "val", "step": 4, "val_loss": 6.4, "val_perplexity": 601.8, "time": 1.0}


class Fake:
    def __init__(self, name: str, fail_at: int | None = None):
        self.name, self.fail_at = name, fail_at
        self.logged: list[tuple[int, dict]] = []
        self.ended: str | None = None

    def log(self, numbers: dict, step: int) -> None:
        if step == self.fail_at:
            raise ConnectionError("server went away")
        self.logged.append((step, numbers))

    def finish(self, status: str) -> None:
        self.ended = status


def trackers(*fakes: Fake) -> Trackers:
    given = Trackers(names=())
    given.live.extend(fakes)
    return given


def test_a_train_row_sends_its_numbers_and_each_ranks_times_and_a_validation_row_its_losses():
    assert metrics_of(TRAIN) == {
        "loss": 6.5, "lr": 1e-4, "tokens_per_s": 1200.0, "mem_mb": 512.0, "grad_norm": 2.5, "step_time_s": 0.25,
        "rank0/compute_s": 0.1, "rank0/comm_s": 0.05, "rank0/data_s": 0.01,
        "rank1/compute_s": 0.12, "rank1/comm_s": 0.04, "rank1/data_s": 0.02}  # no mfu: the row has none
    assert metrics_of(VAL) == {"val_loss": 6.4, "val_perplexity": 601.8}
    assert metrics_of({**TRAIN, "ranks": None})["loss"] == 6.5


def test_log_to_names_known_trackers_only():
    assert requested({"FSDPCTL_LOG_TO": "wandb, mlflow"}) == ("wandb", "mlflow")
    assert requested({}) == ()
    with pytest.raises(ConfigError, match="FSDPCTL_LOG_TO: tensorboard: not a tracker"):
        requested({"FSDPCTL_LOG_TO": "wandb,tensorboard"})


def test_a_tracker_that_fails_while_logging_is_said_once_and_dropped_and_the_others_go_on(capsys):
    flaky, steady = Fake("wandb", fail_at=4), Fake("mlflow")
    both = trackers(flaky, steady)
    both.log({**TRAIN, "step": 2})
    both.log(TRAIN)
    both.log(VAL)
    both.log({**TRAIN, "step": 6})
    assert [step for step, _ in flaky.logged] == [2]
    assert [step for step, _ in steady.logged] == [2, 4, 4, 6]
    said = [line for line in capsys.readouterr().err.splitlines() if line]
    assert said == ["fsdpctl.workload: wandb: logging failed at step 4 (server went away), training goes on "
                    "without it"]
    both.finish("FINISHED")
    assert steady.ended == "FINISHED" and flaky.ended is None and not both.live
    both.finish("FAILED")  # once only
    assert steady.ended == "FINISHED"


@pytest.mark.parametrize(("raised", "status"), [(RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_a_process_that_ends_by_an_exception_ends_its_tracker_runs_first(raised, status):
    fake = Fake("mlflow")
    with pytest.raises(type(raised)), trackers(fake).ended_on_error():
        raise raised
    assert fake.ended == status


def test_a_tracker_that_cannot_be_imported_ends_the_run_in_one_line_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as on a node without it
    with pytest.raises(ConfigError) as raised:
        Trackers(names=("wandb",)).start({"steps": 6})
    text = str(raised.value)
    assert text.startswith("export.wandb: the run logs to wandb and it cannot be imported on this node")
    assert text.endswith("; pip install wandb on every node (or drop export.wandb)") and "\n" not in text


def test_rank_zeros_rows_reach_its_trackers_and_its_end_ends_them(tmp_path):
    pytest.importorskip("torch")
    from fsdpctl.workload.metrics import RunLog

    fake = Fake("wandb")
    log = RunLog(tmp_path, rank=0, trackers=trackers(fake))
    log.train_line(1, 2, 6.5, 1e-4, 1200.0, None, 512.0, 2.5, extra={"step_time_s": 0.25, "ranks": None})
    log.val_line(2, 6.4, 601.8, 0.5)
    log.end("FINISHED")
    assert fake.logged == [(2, {"loss": 6.5, "lr": 1e-4, "tokens_per_s": 1200.0, "mem_mb": 512.0, "grad_norm": 2.5,
                                "step_time_s": 0.25}), (2, {"val_loss": 6.4, "val_perplexity": 601.8})]
    assert fake.ended == "FINISHED"
    other = Fake("wandb")
    RunLog(tmp_path, rank=1, trackers=trackers(other)).val_line(2, 6.4, 601.8, 0.5)
    assert not other.logged
