"""The builtin corpus is learnable: the loss falls clearly within a CI-sized run."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.workload


def test_builtin_corpus_trains(trainer, tmp_path):
    result = trainer(tmp_path / "run", "--steps", "60", "--lr", "3e-3", "--warmup-steps", "5",
                     "--batch-size", "8", "--seq-len", "64", "--eval-interval", "30",
                     "--eval-steps", "4", "--log-interval", "10", "--no-checkpoint")
    losses = result.losses()
    val = result.val_losses()
    assert sorted(losses) == [10, 20, 30, 40, 50, 60]
    uniform = math.log(1024)  # the loss of a model that knows nothing
    assert losses[10] < uniform
    assert val[60] < uniform - 0.8  # more than twice as likely as guessing
    assert val[60] < val[30]
    summary = result.summary()
    assert summary["val_perplexity"] == pytest.approx(math.exp(summary["final_val_loss"]))
    assert summary["median_tokens_per_s"] > 0 and summary["time_to_first_step_s"] > 0
    assert summary["peak_memory_mb_per_rank"][0] > 50
    state = summary["state_bytes_per_rank"][0]
    assert state["params"] == 4 * summary["param_count"] == state["grads"]  # fp32, one rank
    lines = [line for line in result.stdout.splitlines() if " step=" in line and " loss=" in line]
    assert len(lines) == 6 and all(" tok/s=" in line and " mfu=n/a " in line for line in lines)
