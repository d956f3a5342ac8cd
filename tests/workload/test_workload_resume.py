"""Checkpoints: resume is exact, a world-2 checkpoint resumes at world 1, old checkpoints are
pruned, half-written ones are ignored, and the full export loads into a plain GPT."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fsdpctl.workload import checkpoint as ckpt
from fsdpctl.workload import data
from fsdpctl.workload.model import GPT, GPTConfig
from fsdpctl.workload.sampler import Sampler

pytestmark = pytest.mark.workload


def _resume_dir(source: Path, target: Path, step: int) -> Path:
    """A new run dir holding only ``source``'s checkpoint of ``step``."""
    (target / "checkpoints").mkdir(parents=True)
    name = f"step_{step:07d}"
    shutil.copytree(source / "checkpoints" / name, target / "checkpoints" / name)
    return target


def test_checkpoints_are_pruned_to_the_newest(adamw_runs):
    names = sorted(p.name for p in (adamw_runs["fsdp2"].run_dir / "checkpoints").iterdir())
    assert names == ["step_0000010", "step_0000015", "step_0000020"]


def test_resume_gives_identical_losses(adamw_runs, trainer, tmp_path):
    straight = adamw_runs["fsdp2"]
    run_dir = _resume_dir(straight.run_dir, tmp_path / "resumed", 10)
    resumed = trainer(run_dir, *adamw_runs["flags"], "--fsdp", "2", "--resume", "--no-checkpoint",
                      nproc=2)
    assert "resumed_from=step_0000010" in resumed.stdout
    losses = resumed.losses()
    assert sorted(losses) == list(range(11, 21))
    assert all(losses[s] == straight.losses()[s] for s in losses)  # bit-identical
    assert resumed.summary()["final_val_loss"] == straight.summary()["final_val_loss"]


def test_world2_checkpoint_resumes_at_world1(adamw_runs, trainer, tmp_path):
    straight = adamw_runs["fsdp2"]
    run_dir = _resume_dir(straight.run_dir, tmp_path / "world1", 10)
    # same global batch: 1 rank x 8 instead of 2 ranks x 4; FSDP1 to also cross FSDP versions
    resumed = trainer(run_dir, *adamw_runs["flags"], "--fsdp", "1", "--batch-size", "8", "--resume",
                      "--no-checkpoint")
    losses = resumed.losses()
    assert sorted(losses) == list(range(11, 21))
    assert max(abs(losses[s] - straight.losses()[s]) for s in losses) <= 1e-4


def test_the_trainer_tells_the_launcher_its_checkpoints_and_its_batch_split_in_rows(adamw_runs, trainer, tmp_path,
                                                                                    monkeypatch):
    straight = adamw_runs["fsdp2"]
    rows = [json.loads(line) for line in (straight.run_dir / "metrics.jsonl").read_text().splitlines()]
    saved = [(r["step"], r["by"], r["kind"]) for r in rows if r.get("fsdpctl_event") == "checkpoint_saved"]
    assert saved == [(s, "workload", "event") for s in (5, 10, 15, 20)]  # each once complete, the last at the end
    assert not any(r.get("fsdpctl_event") == "batch_split" for r in rows)  # not an elastic run
    monkeypatch.setenv("FSDPCTL_ORIGINAL_WORLD_SIZE", "2")  # an elastic run of 2 ranks, now on 1
    monkeypatch.setenv("FSDPCTL_ATTEMPT", "2")
    run_dir = _resume_dir(straight.run_dir, tmp_path / "shrunk", 10)
    shrunk = trainer(run_dir, *adamw_runs["flags"], "--fsdp", "2", "--resume", "--no-checkpoint")
    assert "elastic: 1 of the run's 2 ranks; global batch 8 kept: batch 4 x accumulation 2 per rank" in shrunk.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (split,) = [r for r in rows if r.get("fsdpctl_event") == "batch_split"]
    assert {k: v for k, v in split.items() if k != "time"} == {
        "fsdpctl_event": "batch_split", "kind": "event", "attempt": 2, "world": 1, "full": 2, "global_batch": 8,
        "batch": 4, "accumulation": 2, "text": "global batch 8 kept: batch 4 x accumulation 2 per rank"}


def test_full_export_loads_into_plain_gpt(adamw_runs, token_cache):
    run_dir = adamw_runs["fsdp2"].run_dir
    summary = adamw_runs["fsdp2"].summary()
    state = torch.load(run_dir / "full.pt", weights_only=True)
    assert all(type(v) is torch.Tensor for v in state.values())
    config = GPTConfig(**json.loads((run_dir / "full.pt.json").read_text()))
    model = GPT(config)
    model.load_state_dict(state, strict=True)
    model.eval()
    corpus = data.load_builtin(token_cache)
    tokens = data.load_tokens(data.cache_folder(token_cache, corpus, 1024), val_fraction=0.1)
    # the run validated on 2 ranks x 4 sequences x 2 batches: the same windows as 1 x 8 x 2
    sampler = Sampler(tokens.val, 32, 8, world=1, rank=0, grad_accum=1, seed=1337)
    with torch.no_grad():
        losses = [model(torch.from_numpy(x), torch.from_numpy(y))[1].item()
                  for x, y in sampler.val_batches(2)]
    assert abs(sum(losses) / len(losses) - summary["final_val_loss"]) <= 1e-5


def test_half_written_checkpoints_are_never_latest(tmp_path):
    root = tmp_path / "checkpoints"
    good = root / "step_0000010"
    good.mkdir(parents=True)
    (good / ".metadata").write_bytes(b"x")
    (good / "trainer_state.json").write_text("{}")
    (root / ".tmp-step_0000020").mkdir()  # a save that died before the rename
    (root / ".tmp-step_0000020" / ".metadata").write_bytes(b"x")
    (root / "step_0000030").mkdir()  # no metadata: not a DCP checkpoint
    (root / "step_30").mkdir()
    assert ckpt.latest_checkpoint(tmp_path) == good
    assert ckpt.latest_checkpoint(tmp_path / "nowhere") is None


def test_resume_without_checkpoint_is_one_line_error(trainer, tmp_path):
    result = trainer(tmp_path / "empty", "--steps", "2", "--resume", nproc=2, expect_rc=None)
    assert result.returncode != 0
    assert result.error_lines() == [
        f"fsdpctl.workload: resume: no complete checkpoint under {tmp_path / 'empty' / 'checkpoints'}; "
        "drop --resume to start afresh, or point --run-dir at the earlier run"]
    # torchrun's agent reports the failed children with a traceback of its own; none of ours
    assert "fsdpctl/workload/" not in result.output


def test_fresh_run_refuses_a_run_dir_with_checkpoints(adamw_runs, trainer, tmp_path):
    run_dir = _resume_dir(adamw_runs["fsdp2"].run_dir, tmp_path / "old", 10)
    result = trainer(run_dir, "--steps", "2", expect_rc=2)
    assert len(result.error_lines()) == 1
    assert "run_dir:" in result.error_lines()[0] and "--resume" in result.error_lines()[0]
    assert "Traceback" not in result.output
