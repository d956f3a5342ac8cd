"""Elastic runs, their pure parts: the global batch on another world size (the trainer's and the
launcher's word for it), an elastic plan's settings and environment, placing a run short of hosts,
the record of a resize, and the watch that grows a short run back at a checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from fsdpctl.api.elastic import batch_on
from fsdpctl.api.events import Emitter
from fsdpctl.api.growing import GrowWatch
from fsdpctl.errors import UsageError
from fsdpctl.hostpool.placing import place_hosts
from fsdpctl.hostpool.store import Exclusion, add_exclusions, remove_exclusion
from fsdpctl.plan.elastic import elastic_env, elastic_settings
from fsdpctl.plan.types import Overrides
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.rundir.status import Resize
from fsdpctl.workload.config import TrainConfig
from fsdpctl.workload.elastic import BatchSplitError, on_this_world, split_global_batch

PROFILE = ("name: el\nbackend: ssh\nhosts: [n1, n2, n3]\nnproc_per_node: 1\ndevice: cpu\nmax_restarts: 2\n"
           "elastic:\n  min_nodes: 2\n")


def profile(text: str = PROFILE):
    return parse_profile(text, "el.yaml")


@pytest.mark.parametrize(("world", "limit", "split"), [(3, 8, (8, 1)), (2, 8, (6, 2)), (2, 12, (12, 1)),
                                                       (1, 8, (8, 3)), (4, 8, (6, 1))])
def test_the_global_batch_splits_into_the_largest_batch_within_the_limit_and_accumulation(world, limit, split):
    assert split_global_batch(24, world, limit) == split


def test_a_global_batch_the_world_does_not_divide_is_refused():
    with pytest.raises(BatchSplitError, match="24 sequences does not split evenly over 5 ranks"):
        split_global_batch(24, 5, 8)


def test_the_trainer_keeps_the_global_batch_and_the_validated_windows_on_fewer_ranks():
    cfg = TrainConfig(batch_size=8, grad_accum=1, eval_steps=2)
    env = {"FSDPCTL_ORIGINAL_WORLD_SIZE": "3"}
    shrunk, line = on_this_world(cfg, 2, 1, env)
    assert (shrunk.batch_size, shrunk.grad_accum, shrunk.eval_steps) == (6, 2, 4)  # 2 x 24 windows, as at 3 ranks
    assert line == "elastic: 2 of the run's 3 ranks; global batch 24 kept: batch 6 x accumulation 2 per rank"
    grown, _ = on_this_world(cfg, 2, 1, {**env, "FSDPCTL_ELASTIC_BATCH_LIMIT": "12"})
    assert (grown.batch_size, grown.grad_accum) == (12, 1)
    assert on_this_world(cfg, 3, 1, env) == (cfg, None)  # at its full size nothing changes
    assert on_this_world(cfg, 2, 1, {}) == (cfg, None)  # not an elastic run
    counted, _ = on_this_world(cfg, 4, 2, {"FSDPCTL_ORIGINAL_NODES": "3"})  # ranks counted on the nodes: 3 x 2
    assert (counted.batch_size, counted.grad_accum) == (6, 2)


def test_an_elastic_plan_says_its_full_size_and_changes_to_every_rank():
    settings = elastic_settings(profile(), Overrides(), 3)
    assert settings == {"min_nodes": 2, "full_nodes": 3, "changes": 0, "recheck": False, "grow_batch": True}
    shrunk = elastic_settings(profile(), Overrides(full_nodes=3, elastic_changes=1), 2)
    assert elastic_env(shrunk, "4", 16) == {"FSDPCTL_ORIGINAL_NODES": "3", "FSDPCTL_ELASTIC_ATTEMPT": "1",
                                            "FSDPCTL_ORIGINAL_WORLD_SIZE": "12", "FSDPCTL_ELASTIC_BATCH_LIMIT": "16"}
    assert "FSDPCTL_ORIGINAL_WORLD_SIZE" not in elastic_env(shrunk, "auto", None)
    assert elastic_env(shrunk, "1", None, program=True)["FSDPCTL_SAY_SAVES"] == "1"  # rank 0 says its DCP saves
    assert elastic_settings(profile(), Overrides(min_nodes=0), 3) == {}  # --min-nodes 0: off
    with pytest.raises(UsageError, match="--min-nodes 4: more than the run's 3 nodes"):
        elastic_settings(profile(), Overrides(min_nodes=4), 3)


def test_an_elastic_profile_places_a_run_short_of_an_excluded_host_down_to_min_nodes():
    add_exclusions("el", [Exclusion("n2", "lost", "run-1", "now")])
    choice = place_hosts(profile(), (), min_nodes=2)
    assert choice.hosts == ("n1", "n3") and choice.missing == ("n2",) and choice.full == 3
    with pytest.raises(UsageError, match="1 host\\(s\\) missing; fewer than min_nodes 3 left"):
        place_hosts(profile(), (), min_nodes=3)
    with pytest.raises(UsageError, match="no spare left"):
        place_hosts(profile(), ())


def test_elastic_refuses_a_min_nodes_above_the_hosts_and_a_profile_without_restarts():
    from fsdpctl.errors import ProfileError

    with pytest.raises(ProfileError, match="elastic.min_nodes: 4 is more than the profile's 3 hosts"):
        profile(PROFILE.replace("min_nodes: 2", "min_nodes: 4"))
    with pytest.raises(ProfileError, match="elastic: a run goes on with fewer nodes by a restart"):
        profile(PROFILE.replace("max_restarts: 2", "max_restarts: 0"))


def test_a_resize_says_itself_and_goes_through_run_json():
    shrink = Resize(nodes=2, before=3, full=3, hosts=("n3",), why="lost: nothing heard",
                    batch="global batch 24 kept: batch 6 x accumulation 2 per rank")
    assert shrink.describe() == ("runs on 2 of 3 nodes: n3 out (lost: nothing heard); global batch 24 kept: "
                                 "batch 6 x accumulation 2 per rank")
    grow = dataclasses.replace(shrink, nodes=3, before=2, why="restored", batch=None)
    assert grow.describe() == "grows back to 3 of 3 nodes: n3 back (restored)"
    assert Resize.from_json(shrink.to_json()) == shrink and Resize.from_json(None) is None


def fake_run(tmp_path: Path, text: str = PROFILE, *, nodes: int = 2, command=(), log: str = "", **elastic):
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "node0.log").write_text(log)
    plan = SimpleNamespace(command=command, num_nodes=nodes, nproc_per_node="1", run_id="el-1",
                           train={"batch_size": 8, "preset": "tiny", "seq_len": 64},
                           elastic={"min_nodes": 2, "full_nodes": 3, "changes": 0, "recheck": False,
                                    "grow_batch": True, **elastic})
    return SimpleNamespace(plan=plan, profile=profile(text), root=tmp_path,
                           paths=SimpleNamespace(logs=logs, root=tmp_path), run_id="el-1")


FIRST_LINE = "[rank0]:fsdpctl.workload: world=3 device=cpu fsdp=2 sharding=full preset=tiny batch=8 optimizer=adamw\n"


def test_on_cpus_the_launcher_says_the_split_with_more_accumulation(tmp_path):
    planned = batch_on(fake_run(tmp_path, log=FIRST_LINE), 2, Emitter(None))
    assert planned.text == "global batch 24 kept: batch 6 x accumulation 2 per rank" and planned.limit is None
    refused = batch_on(fake_run(tmp_path, log=FIRST_LINE.replace("batch=8", "batch=7")), 2, Emitter(None))
    assert refused.refused is not None and "does not split evenly" in refused.refused


@pytest.mark.parametrize(("memory", "grow_batch", "limit"), [("80GiB", True, 12), ("80GiB", False, None),
                                                             ("300MiB", True, None)])
def test_with_the_gpus_memory_known_the_batch_grows_where_the_estimate_says_it_fits(tmp_path, memory,
                                                                                   grow_batch, limit):
    text = PROFILE.replace("device: cpu\n", f"device: cuda\ngpu_memory: {memory}\n")
    planned = batch_on(fake_run(tmp_path, text, log=FIRST_LINE, grow_batch=grow_batch), 2, Emitter(None))
    assert planned.limit == limit
    assert planned.text == ("global batch 24 kept: batch 12 per rank" if limit else
                            "global batch 24 kept: batch 6 x accumulation 2 per rank")


def test_a_short_run_grows_at_the_checkpoint_after_its_host_is_restored(tmp_path):
    add_exclusions("el", [Exclusion("n3", "lost", "run-1", "now")])
    watch = GrowWatch(fake_run(tmp_path), Emitter(None))
    watch.saw_any(["[rank0]:fsdpctl.workload: checkpoint step=10 saved"])
    assert watch.due() is None  # n3 is still out
    remove_exclusion("el", "n3")
    watch.saw_any(["step=11 loss=3.2", "a line of the program's saying checkpoint"])
    assert watch.due() is None  # not at a checkpoint
    watch.saw_any(["[rank0]:fsdpctl.workload: checkpoint step=20 saved"])
    assert watch.due() == 0.0
    verdict = watch.fire(0.0)
    assert verdict.stop and verdict.failure.kind == "resize"
    assert verdict.failure.detail == "stopped at the checkpoint of step 20 to grow back to 3 of 3 nodes"
    assert watch.due() is None and watch.grow_to.hosts == ("n1", "n2", "n3")
    program = GrowWatch(fake_run(tmp_path, command=("train.py",)), Emitter(None))
    program.saw_any(["[rank0]:fsdpctl: checkpoint saved (torch.distributed.checkpoint.save returned on rank 0)"])
    assert program.due() == 0.0
