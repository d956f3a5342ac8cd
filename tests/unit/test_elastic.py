"""Elastic runs, their pure parts: the global batch on another world size (the trainer's and the
launcher's word for it, the launcher's read from the trainer's row), an elastic plan's settings and
environment, placing a run short of hosts, the record of a resize, and the watch that grows a short
run back at a checkpoint row (a printed look-alike grows nothing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from fsdpctl.api.elastic import batch_on, global_batch
from fsdpctl.api.events import Emitter
from fsdpctl.api.growing import GrowWatch
from fsdpctl.errors import UsageError
from fsdpctl.hostpool.placing import place_hosts
from fsdpctl.hostpool.store import Exclusion, add_exclusions, remove_exclusion
from fsdpctl.live import layout
from fsdpctl.node.events import BATCH_SPLIT, CHECKPOINT_SAVED, event_line
from fsdpctl.plan.elastic import elastic_env, elastic_settings
from fsdpctl.plan.elastic_policy import ElasticPlan
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
    from fsdpctl.workload.elastic import split_line

    cfg = TrainConfig(batch_size=8, grad_accum=1, eval_steps=2)
    env = {"FSDPCTL_ORIGINAL_WORLD_SIZE": "3"}
    shrunk, split = on_this_world(cfg, 2, 1, env)
    assert (shrunk.batch_size, shrunk.grad_accum, shrunk.eval_steps) == (6, 2, 4)  # 2 x 24 windows, as at 3 ranks
    assert split == {"world": 2, "full": 3, "global_batch": 24, "batch": 6, "accumulation": 2,
                     "text": "global batch 24 kept: batch 6 x accumulation 2 per rank"}  # its BATCH_SPLIT row
    assert split_line(split) == ("elastic: 2 of the run's 3 ranks; global batch 24 kept: batch 6 x accumulation 2 "
                                 "per rank")  # for people
    grown, _ = on_this_world(cfg, 2, 1, {**env, "FSDPCTL_ELASTIC_BATCH_LIMIT": "12"})
    assert (grown.batch_size, grown.grad_accum) == (12, 1)
    full, split = on_this_world(cfg, 3, 1, env)  # at its full size nothing changes; the row says the batch
    assert full == cfg and (split["world"], split["global_batch"], split["batch"]) == (3, 24, 8)
    assert split_line(split) is None
    assert on_this_world(cfg, 2, 1, {}) == (cfg, None)  # not an elastic run
    counted, _ = on_this_world(cfg, 4, 2, {"FSDPCTL_ORIGINAL_NODES": "3"})  # ranks counted on the nodes: 3 x 2
    assert (counted.batch_size, counted.grad_accum) == (6, 2)


def test_an_elastic_plan_says_its_full_size_and_changes_to_every_rank():
    settings = elastic_settings(profile(), Overrides(), 3)
    assert settings == ElasticPlan(min_nodes=2, full_nodes=3, changes=0, recheck=False, grow_batch=True)
    shrunk = elastic_settings(profile(), Overrides(full_nodes=3, elastic_changes=1), 2)
    assert elastic_env(shrunk, "4", 16) == {"FSDPCTL_ORIGINAL_NODES": "3", "FSDPCTL_ELASTIC_ATTEMPT": "1",
                                            "FSDPCTL_ORIGINAL_WORLD_SIZE": "12", "FSDPCTL_ELASTIC_BATCH_LIMIT": "16"}
    assert "FSDPCTL_ORIGINAL_WORLD_SIZE" not in elastic_env(shrunk, "auto", None)
    assert elastic_env(shrunk, "1", None, program=True)["FSDPCTL_SAY_SAVES"] == "1"  # rank 0 says its DCP saves
    assert elastic_settings(profile(), Overrides(min_nodes=0), 3) is None  # --min-nodes 0: off
    with pytest.raises(UsageError, match="--min-nodes 4: more than the run's 3 nodes"):
        elastic_settings(profile(), Overrides(min_nodes=4), 3)


def test_the_elastic_policy_decides_going_without_a_host_the_next_size_and_growing_back():
    from fsdpctl.plan.elastic_policy import goes_on_short, goes_without, grows_back, min_nodes_in, next_size

    plan = ElasticPlan(min_nodes=2, full_nodes=3, changes=1)
    # without a host: only a lost one (its re-check would wait for SSH), and only down to min_nodes
    assert goes_without(plan, lost=True, hosts_left=2)
    assert not goes_without(plan, lost=False, hosts_left=2) and not goes_without(plan, lost=True, hosts_left=1)
    assert not goes_without(None, lost=True, hosts_left=5)
    assert goes_on_short(plan, 2) and not goes_on_short(plan, 1) and not goes_on_short(None, 2)
    assert (min_nodes_in(plan), min_nodes_in(None)) == (2, 0)
    # the next size: short keeps the full size, a change of count is counted, full again forgets it
    assert next_size(plan, nodes_before=3, nodes=2, full_nodes=None) == {"full_nodes": 3, "elastic_changes": 2}
    assert next_size(plan, nodes_before=2, nodes=2, full_nodes=None) == {"full_nodes": 3, "elastic_changes": 1}
    assert next_size(plan, nodes_before=2, nodes=3, full_nodes=3) == {"full_nodes": None, "elastic_changes": 2}
    assert next_size(plan, nodes_before=2, nodes=3, full_nodes=4) == {"full_nodes": 4, "elastic_changes": 2}
    assert next_size(None, nodes_before=3, nodes=2, full_nodes=3) == {}
    # growing back: short of the full size, and more hosts placeable than the attempt has
    assert grows_back(plan, nodes=2, placeable=3)
    assert not grows_back(plan, nodes=2, placeable=2) and not grows_back(plan, nodes=3, placeable=4)
    assert not grows_back(None, nodes=2, placeable=3)


def test_a_plans_elastic_part_is_typed_and_read_back_from_plan_json():
    import json

    from fsdpctl.backends import plan_run
    from fsdpctl.plan.types import plan_from_json

    plan = plan_run(profile(), run_id="el-20261130-000000-0a1b", local_run_dir="r",
                    overrides=Overrides(full_nodes=3, elastic_changes=1))
    assert plan.elastic == ElasticPlan(min_nodes=2, full_nodes=3, changes=1)
    written = json.loads(json.dumps(plan.to_json()))
    back = plan_from_json(written)
    assert back.elastic == plan.elastic and json.loads(json.dumps(back.to_json())) == written
    assert plan_from_json({**plan.to_json(), "elastic": {}}).elastic is None  # fsdpctl 0.2's "not elastic"
    assert plan_from_json({**plan.to_json(), "elastic": None}).elastic is None


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


def fake_run(tmp_path: Path, text: str = PROFILE, *, nodes: int = 2, command=(), attempt: int = 1, **elastic):
    """A run of the ssh backend as the launcher has it: its nodes' files are copies under ``live/``."""
    logs = tmp_path / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    plan = SimpleNamespace(command=command, num_nodes=nodes, nproc_per_node="1", run_id="el-1", attempt=attempt,
                           run_dir="~/fsdpctl-runs/el-1", nodes=(),
                           train={"batch_size": 8, "preset": "tiny", "seq_len": 64},
                           elastic=ElasticPlan(**{"min_nodes": 2, "full_nodes": 3, **elastic}))
    return SimpleNamespace(plan=plan, profile=profile(text), root=tmp_path,
                           paths=SimpleNamespace(logs=logs, root=tmp_path), run_id="el-1")


def workload_rows(run, *lines: str, node: int = 0, name: str = layout.METRICS) -> None:
    """Lines of a node's ``name`` as the collector copies them here (the bundled workload's rank 0
    writes its rows into metrics.jsonl)."""
    copy = layout.collected(run.root, node, name)
    copy.parent.mkdir(parents=True, exist_ok=True)
    with copy.open("a") as handle:
        handle.write("".join(lines))


def said_split(world: int, batch: int, accum: int = 1, *, full: int = 3, total: int = 24) -> str:
    """The row the trainer writes as an attempt starts (its global batch of ``total`` sequences kept)."""
    split = f"batch {batch} x accumulation {accum} per rank" if accum > 1 else f"batch {batch} per rank"
    return event_line(BATCH_SPLIT, world=world, full=full, global_batch=total, batch=batch, accumulation=accum,
                      text=f"global batch {total} kept: {split}")


FIRST_LINE = "[rank0]:fsdpctl.workload: world=3 device=cpu fsdp=2 sharding=full preset=tiny batch=8 optimizer=adamw\n"
KEPT = ("[rank0]:fsdpctl.workload: elastic: 2 of the run's 3 ranks; global batch 24 kept: batch 6 x accumulation 2 "
        "per rank\n")


def test_on_cpus_the_launcher_says_the_split_with_more_accumulation(tmp_path):
    run = fake_run(tmp_path)
    workload_rows(run, said_split(3, 8))
    planned = batch_on(run, 2, Emitter(None))
    assert planned.text == "global batch 24 kept: batch 6 x accumulation 2 per rank" and planned.limit is None
    odd = fake_run(tmp_path / "odd")
    odd.plan.train["batch_size"] = 7
    workload_rows(odd, said_split(3, 7, total=21))
    refused = batch_on(odd, 2, Emitter(None))
    assert refused.refused is not None and "does not split evenly" in refused.refused


def test_the_global_batch_is_read_from_the_trainers_row_never_from_its_printed_lines(tmp_path):
    run = fake_run(tmp_path)
    del run.plan.train["batch_size"]  # the batch as given is the device's default: only the ranks know it
    (run.paths.logs / "node0.log").write_text(FIRST_LINE + KEPT)  # printed, for people
    assert global_batch(run) is None and batch_on(run, 2, Emitter(None)).text is None
    workload_rows(run, '{"kind": "train", "step": 1, "loss": 9.1}\n', said_split(2, 6, 2))
    assert global_batch(run) == (24, 8)  # 24 sequences a step; 8 per rank at the full size (x 1 accumulation)
    assert batch_on(run, 1, Emitter(None)).text == "global batch 24 kept: batch 8 x accumulation 3 per rank"


@pytest.mark.parametrize(("memory", "grow_batch", "limit"), [("80GiB", True, 12), ("80GiB", False, None),
                                                             ("300MiB", True, None)])
def test_with_the_gpus_memory_known_the_batch_grows_where_the_estimate_says_it_fits(tmp_path, memory,
                                                                                   grow_batch, limit):
    text = PROFILE.replace("device: cpu\n", f"device: cuda\ngpu_memory: {memory}\n")
    run = fake_run(tmp_path, text, grow_batch=grow_batch)
    workload_rows(run, said_split(3, 8))
    planned = batch_on(run, 2, Emitter(None))
    assert planned.limit == limit
    assert planned.text == ("global batch 24 kept: batch 12 per rank" if limit else
                            "global batch 24 kept: batch 6 x accumulation 2 per rank")


LOOK_ALIKES = ["[rank0]:fsdpctl.workload: checkpoint step=3 saved",  # a script of yours may print anything
               "[rank0]:fsdpctl: checkpoint saved (torch.distributed.checkpoint.save returned on rank 0)"]


def listening(run, watch: GrowWatch, monkeypatch):
    """The run's collector, as its follower makes it, with the watch listening (the copies read at
    each beat)."""
    from fsdpctl.live import collector as collector_module
    from fsdpctl.live.collector import Collector, listen

    monkeypatch.setattr(collector_module, "EVENT_SECONDS", 0.0)
    collector = Collector(run.root, run.plan, run.plan.attempt)
    listen(collector, Emitter(None), watch)
    return collector


def test_a_printed_look_alike_grows_nothing_and_a_checkpoint_row_of_the_attempt_does(tmp_path, monkeypatch):
    run = fake_run(tmp_path, attempt=2)
    watch = GrowWatch(run, Emitter(None))
    watch.saw_any(LOOK_ALIKES)
    assert watch.due() is None  # every host is back, but a line is no checkpoint
    collector = listening(run, watch, monkeypatch)
    workload_rows(run, *(line + "\n" for line in LOOK_ALIKES), '{"kind": "train", "step": 3, "loss": 4.2}\n')
    monkeypatch.setenv("FSDPCTL_ATTEMPT", "1")
    workload_rows(run, event_line(CHECKPOINT_SAVED, step=3, by="workload"))  # the attempt before's, read again
    collector.beat(list)
    assert watch.due() is None
    monkeypatch.setenv("FSDPCTL_ATTEMPT", "2")
    workload_rows(run, event_line(CHECKPOINT_SAVED, step=20, by="workload"))
    collector.beat(list)
    assert watch.due() == 0.0
    verdict = watch.fire(0.0)
    assert verdict.stop and verdict.failure.kind == "resize"
    assert verdict.failure.detail == "stopped at the checkpoint of step 20 to grow back to 3 of 3 nodes"


def test_a_short_run_grows_at_the_checkpoint_after_its_host_is_restored(tmp_path, monkeypatch):
    add_exclusions("el", [Exclusion("n3", "lost", "run-1", "now")])
    run = fake_run(tmp_path)
    watch = GrowWatch(run, Emitter(None))
    collector = listening(run, watch, monkeypatch)
    workload_rows(run, event_line(CHECKPOINT_SAVED, step=10, by="workload"))
    collector.beat(list)
    assert watch.due() is None  # n3 is still out
    remove_exclusion("el", "n3")
    workload_rows(run, '{"kind": "train", "step": 11, "loss": 3.2}\n')
    collector.beat(list)
    assert watch.due() is None  # not at a checkpoint
    workload_rows(run, event_line(CHECKPOINT_SAVED, step=20, by="workload"))
    collector.beat(list)
    assert watch.due() == 0.0
    verdict = watch.fire(0.0)
    assert verdict.failure.detail == "stopped at the checkpoint of step 20 to grow back to 3 of 3 nodes"
    assert watch.due() is None and watch.grow_to.hosts == ("n1", "n2", "n3")


def test_a_program_grows_at_the_row_the_start_up_hook_writes_after_its_dcp_save(tmp_path, monkeypatch):
    from fsdpctl.node.startup import sitecustomize as hook

    run = fake_run(tmp_path, command=("train.py",))
    watch = GrowWatch(run, Emitter(None))
    watch.saw_any(LOOK_ALIKES[1:])
    assert watch.due() is None
    collector = listening(run, watch, monkeypatch)
    node1 = tmp_path / "node1"  # rank 0 of the program on node 1: its run directory there
    for name, value in {"FSDPCTL_RUN_DIR": str(node1), "FSDPCTL_NODE_RANK": "1", "RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    dcp = SimpleNamespace(save=lambda state, checkpoint_id: f"saved {checkpoint_id}")
    hook._time_checkpoints(dcp)
    assert dcp.save({}, checkpoint_id="ckpt/step_5") == "saved ckpt/step_5"
    workload_rows(run, (node1 / "telemetry" / "node1.jsonl").read_text(), node=1, name=layout.telemetry_name(1))
    collector.beat(list)
    assert watch.due() == 0.0 and watch.fire(0.0).failure.detail == (
        "stopped at a checkpoint to grow back to 3 of 3 nodes")


def test_a_short_elastic_run_grows_back_onto_a_spare_added_to_its_profile_file(tmp_path):
    """Short of its lost n2, the run finds no host to grow onto until a spare appears in its profile
    file; then the watch's placement has all three nodes, the spare in n2's place."""
    import json

    from fsdpctl.api.growing import hosts_now

    source = tmp_path / "el.yaml"
    source.write_text(PROFILE)
    run = fake_run(tmp_path, nodes=2)
    (tmp_path / "inputs.json").write_text(json.dumps({"profile_source": str(source)}))
    add_exclusions("el", [Exclusion("n2", "lost", "el-1", "now")])
    assert hosts_now(run) is None
    source.write_text(PROFILE + "spares: [n4]\n")
    grown = hosts_now(run)
    assert grown is not None and grown.hosts == ("n1", "n4", "n3") and grown.full == 3
