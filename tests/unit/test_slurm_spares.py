"""A Slurm job holding spare nodes (or an elastic one): its batch script, and the decisions
``fsdpctl.node.slurm_steps`` makes after a failed step (which node is to blame, which spare takes its
place, which nodes an elastic job goes on with), as pure functions and through stand-in Slurm clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fsdpctl.backends import plan_run
from fsdpctl.backends.slurm.plan import SlurmPlan
from fsdpctl.backends.slurm.scripts import render_sbatch_script
from fsdpctl.backends.slurm.steps import (
    json_lines,
    metrics_text,
    read_events,
    recovery_of,
    replacements_of,
    resize_of,
    spare_changes,
)
from fsdpctl.errors import UsageError
from fsdpctl.node import slurm_steps
from fsdpctl.node.events import BATCH_SPLIT, event_line
from fsdpctl.plan.types import Overrides
from fsdpctl.profiles.loader import load_profile, parse_profile
from tests.unit.test_slurm_plan import RUN_ID, slurm_plan

SUMMARY = """[rank1]: Traceback (most recent call last):
============================================================
fsdpctl.workload.train FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_10:00:00
  host      : n2
  rank      : 1 (local_rank: 0)
  exitcode  : {code} (pid: 4242)
  error_file: <N/A>
============================================================
"""


def test_spares_hold_more_nodes_with_no_kill_and_run_the_steps_through_the_node_helper():
    plan, slurm = slurm_plan(spares=2)
    directives = dict(slurm.directives)
    assert directives["nodes"] == str(plan.num_nodes + 2) and directives["no-kill"] == ""
    assert slurm.nodes == plan.num_nodes and slurm.spares == 2
    script = render_sbatch_script(plan)
    assert f'-m fsdpctl.node.slurm_steps --nodes={plan.num_nodes} --gpus-per-node=' in script
    assert "srun --kill-on-bad-exit=1 --nodes=" not in script  # the helper starts every step itself
    plain_plan, plain = slurm_plan()
    assert "no-kill" not in dict(plain.directives) and "slurm_steps" not in render_sbatch_script(plain_plan)


def test_spares_with_requeue_keep_the_requeue_after_the_steps():
    plan, _ = slurm_plan(spares=1, requeue=True)
    script = render_sbatch_script(plan)
    assert '-- bash -c' in script and ' || status=$?' in script and "scontrol requeue" in script


def test_spares_through_submitit_and_negative_spares_are_refused():
    with pytest.raises(UsageError, match="submitit starts the step on every node"):
        slurm_plan(spares=1, via="submitit")
    with pytest.raises(UsageError, match="--spares: -1 is not a count"):
        slurm_plan(spares=-1)
    with pytest.raises(UsageError, match=r"slurm\.spares.*negative"):
        parse_profile("name: s\nbackend: slurm\nslurm: {nodes: 2, spares: -1}\n", "s.yaml")


def test_the_signal_a_summary_names_and_a_plain_exit_code():
    assert slurm_steps.summary_signal(SUMMARY.format(code=-9)) == 9
    assert slurm_steps.summary_signal(SUMMARY.format(code=3)) is None
    assert slurm_steps.summary_signal("no summary here") is None


def test_a_node_is_blamed_for_a_signal_only_when_no_other_node_got_it(tmp_path):
    (tmp_path / "node0.log").write_text(SUMMARY.format(code=1))
    (tmp_path / "node1.log").write_text(SUMMARY.format(code=-9))
    assert list(slurm_steps.signalled_alone(["n1", "n2"], str(tmp_path))) == ["n2"]
    (tmp_path / "node0.log").write_text(SUMMARY.format(code=-9))  # every node killed alike: no one's fault
    assert slurm_steps.signalled_alone(["n1", "n2"], str(tmp_path)) == {}
    (tmp_path / "node0.log").write_text(SUMMARY.format(code=1))
    (tmp_path / "node1.log").write_text(SUMMARY.format(code=-15))  # a stop (srun's, scancel's): never blamed
    assert slurm_steps.signalled_alone(["n1", "n2"], str(tmp_path)) == {}


def test_a_blamed_node_gets_the_first_spare_that_passes_and_ranks_follow_slurms_order():
    allocation = ["a1", "a2", "a3", "a4", "a5"]
    checked = []

    def passes(host):
        checked.append(host)
        return "failed the re-check: no slurmd" if host == "a4" else None

    nodes, replacements, left, failed = slurm_steps.choose(["a1", "a2", "a3"], ["a4", "a5"], {"a1": "lost"},
                                                           allocation, passes)
    assert nodes == ["a2", "a3", "a5"] and checked == ["a4", "a5"] and left == []
    assert replacements == [{"host": "a1", "by": "a5", "why": "lost"}]
    assert failed == {"a4": "failed the re-check: no slurmd"}


def test_no_spare_left_gives_no_nodes():
    nodes, replacements, left, failed = slurm_steps.choose(["a1", "a2"], ["a3"], {"a1": "x", "a2": "y"},
                                                           ["a1", "a2", "a3"], lambda h: None)
    assert nodes is None and replacements == [{"host": "a1", "by": "a3", "why": "x"}] and left == []


def test_the_gpu_recheck_fails_on_a_node_that_sees_fewer_gpus():
    """The re-check's own command, run here: this machine's torch sees no GPU, so asking for two fails
    with the count in its last words; asking for none passes."""
    pytest.importorskip("torch")
    want = 2
    done = subprocess.run(slurm_steps.probe_command(sys.executable, want), capture_output=True, text=True, timeout=120)
    import torch

    if torch.cuda.device_count() >= want:
        assert done.returncode == 0
    else:
        assert done.returncode != 0 and f"of {want}" in done.stderr.strip().splitlines()[-1]
    assert subprocess.run(slurm_steps.probe_command(sys.executable, 0), timeout=60).returncode == 0


@pytest.mark.parametrize("changed", ["replaced", "shrunk"])
def test_status_reads_the_replacement_and_what_it_cost(changed):
    events = json_lines("\n".join(json.dumps(e) for e in [
        {"event": "step", "step": 1, "hosts": ["n1", "n2"], "at_s": 100.0},
        {"event": "failed", "step": 1, "blamed": {"n2": "failed the re-check: gone"}, "last_step": 14,
         "last_step_at": 110.0, "at_s": 125.0},
        {"event": changed, "step": 2, "hosts": ["n1", "n3"], "from_step": 10, "at_s": 125.1, "nodes": 2,
         "replacements": [{"host": "n2", "by": "n3", "why": "failed the re-check: gone"}]},
    ]) + '\n{"cut sh')
    metrics = [{"kind": "train", "step": 14, "time": 110.0}, {"kind": "train", "step": 12, "time": 131.5},
               {"kind": "train", "step": 14, "time": 132.0}]
    [replaced] = replacements_of(events)
    assert replaced.describe() == "n3 in the place of n2 (failed the re-check: gone)"
    recovery = recovery_of(events, metrics)
    assert recovery is not None and recovery.steps_redone == 4 and recovery.stood_still_s == pytest.approx(21.5)
    assert recovery_of(events[:2], metrics) is None  # no replacement yet


def elastic_plan(min_nodes, **options):
    plan = plan_run(load_profile("slurm").profile, run_id=RUN_ID, local_run_dir="r", home="/home/me",
                    backend="slurm", overrides=Overrides(min_nodes=min_nodes, backend_options=options))
    return plan, SlurmPlan.of(plan)


def test_an_elastic_plan_runs_its_steps_through_the_helper_with_no_kill_and_the_steps_own_node_count():
    plan, slurm = elastic_plan(1)
    assert dict(slurm.directives)["nodes"] == "2" and dict(slurm.directives)["no-kill"] == "" and slurm.min_nodes == 1
    script = render_sbatch_script(plan)
    assert "-m fsdpctl.node.slurm_steps --nodes=2 --gpus-per-node=8 --min-nodes=1 " in script
    assert '--nnodes "$SLURM_STEP_NUM_NODES"' in slurm.step_command  # torchrun waits for the step's nodes
    assert "--min-nodes" not in render_sbatch_script(slurm_plan(spares=1)[0])
    with pytest.raises(UsageError, match="elastic.min_nodes: submitit starts the step on every node"):
        elastic_plan(1, via="submitit")
    with pytest.raises(UsageError, match=r"elastic\.min_nodes: 3 is more than slurm\.nodes \(2\)"):
        parse_profile("name: s\nbackend: slurm\nslurm: {nodes: 2}\nelastic: {min_nodes: 3}\n", "s.yaml")


def test_with_too_few_spares_an_elastic_job_goes_on_with_the_healthy_nodes_down_to_min_nodes():
    allocation = ["a1", "a2", "a3", "a4"]
    nodes, replacements, _, _ = slurm_steps.choose(["a1", "a2", "a3"], ["a4"], {"a1": "x", "a3": "y"}, allocation,
                                                   lambda h: None)
    assert nodes is None  # a4 took a1's place; none is left for a3
    assert slurm_steps.shrink(["a1", "a2", "a3"], {"a1": "x", "a3": "y"}, replacements, allocation, 2) == ["a2", "a4"]
    assert slurm_steps.shrink(["a1", "a2", "a3"], {"a1": "x", "a3": "y"}, replacements, allocation, 3) is None
    assert slurm_steps.shrink(["a1", "a2"], {"a2": "x"}, [], allocation, 0) is None  # not elastic


def split_row(world: int, full: int, total: int, batch: int, accum: int) -> str:
    """The row the bundled workload's rank 0 writes into metrics.jsonl as a step starts."""
    split = f"batch {batch} x accumulation {accum} per rank" if accum > 1 else f"batch {batch} per rank"
    return event_line(BATCH_SPLIT, world=world, full=full, global_batch=total, batch=batch, accumulation=accum,
                      text=f"global batch {total} kept: {split}")


def test_the_batch_a_shrink_kept_is_its_sizes_row_in_metrics_never_a_printed_line(tmp_path):
    events = [{"event": "shrunk", "nodes": 2, "before": 3, "full": 4, "out": ["n3"], "why": "lost"}]
    printed = "[rank0]:fsdpctl.workload: elastic: 4 of the run's 8 ranks; global batch 64 kept: batch 16 per rank\n"
    (tmp_path / "node0.log").write_text(printed)
    rows = json_lines(split_row(8, 8, 64, 8, 1) + printed + split_row(6, 8, 64, 8, 1))  # the steps on 4 and 3 nodes
    assert resize_of(events, rows).batch is None  # the step on 2 nodes has not said its split yet
    rows += json_lines(split_row(4, 8, 64, 8, 2) + '{"kind": "train", "step": 9}\n')
    assert resize_of(events, rows).batch == "global batch 64 kept: batch 8 x accumulation 2 per rank"


FAKE_SRUN = """#!/bin/bash
# A step on n1,n2 fails (n2 is gone: it fails the re-check); a step on n1 alone trains on. With
# PROGRAM_ERROR set every step fails and every node passes.
for arg in "$@"; do case $arg in --nodelist=*) hosts=${arg#--nodelist=};; --kill-on-bad-exit=0) probe=1;; esac; done
if [ -n "$probe" ]; then
  [ "$hosts" != n2 ] || [ -n "$PROGRAM_ERROR" ] || { echo "srun: error: Unable to contact slurmd on n2" >&2; exit 1; }
  exit 0
fi
echo "$hosts $FSDPCTL_ELASTIC_ATTEMPT" >> "$FSDPCTL_RUN_DIR/steps.txt"
case $hosts$PROGRAM_ERROR in *n2*) exit 1;; esac
# the bundled workload's rank 0 says its split in a row of metrics.jsonl (the launcher reads no line of it)
echo 'SPLIT_ROW' >> "$FSDPCTL_RUN_DIR/metrics.jsonl"
"""


def stand_in_slurm(tmp_path, monkeypatch, split: str, program_error: str = "") -> None:
    """``srun`` (FAKE_SRUN, its rank 0 writing ``split``) and ``scontrol`` on PATH, and the batch
    script's environment: the run directory, the plan's elastic count (0)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.replace("SPLIT_ROW", split.strip()))
    (bin_dir / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FSDPCTL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("FSDPCTL_ELASTIC_ATTEMPT", "0")  # the batch script's export of the plan's count
    monkeypatch.setenv("PROGRAM_ERROR", program_error)


@pytest.mark.parametrize("min_nodes,program_error", [(1, ""), (2, ""), (1, "1")],
                         ids=["shrinks", "below-min-nodes", "program-error"])
def test_a_lost_node_with_no_spare_shrinks_an_elastic_job_down_to_min_nodes_and_below_it_ends_the_job(
        tmp_path, monkeypatch, min_nodes, program_error):
    """The helper's loop with stand-in ``srun`` and ``scontrol`` on PATH (no cluster here)."""
    stand_in_slurm(tmp_path, monkeypatch, split_row(1, 2, 8, 4, 2), program_error)
    steps = slurm_steps.Steps(str(tmp_path), 2, sys.executable, 0, ["true"], min_nodes=min_nodes)
    code = steps.run(["n1", "n2"])
    events = read_events(tmp_path)
    said = (tmp_path / "node0.log").read_text()
    if program_error:  # nobody to blame: nothing shrinks
        assert code == 1 and [e["event"] for e in events] == ["step", "failed"] and "no node is to blame" in said
        return
    if min_nodes == 2:
        assert code == 1 and [e["event"] for e in events] == ["step", "failed", "ended"]
        assert "no spare left: 1 node(s) missing; 1 node(s) left, fewer than min_nodes 2, the job ends" in said
        assert events[-1]["why"] == "fewer than min_nodes 2" and spare_changes(tmp_path, "")["resize"] is None
        return
    assert code == 0 and [e["event"] for e in events] == ["step", "failed", "shrunk", "step", "succeeded"]
    assert (tmp_path / "steps.txt").read_text().splitlines() == ["n1,n2 0", "n1 1"]  # the count changed once
    shrunk = events[2]
    assert (shrunk["hosts"], shrunk["out"], shrunk["nodes"], shrunk["before"], shrunk["full"]) == (
        ["n1"], ["n2"], 1, 2, 2)
    assert ("fsdpctl: step 2 runs on 1 of 2 nodes: n2 out (failed the re-check: Unable to contact slurmd on n2); "
            "it continues from the newest checkpoint (min_nodes 1)") in said
    resize = spare_changes(tmp_path, metrics_text(tmp_path))["resize"]
    assert resize.describe() == ("runs on 1 of 2 nodes: n2 out (failed the re-check: Unable to contact slurmd on "
                                 "n2); global batch 8 kept: batch 4 x accumulation 2 per rank")


def test_a_requeued_elastic_job_counts_the_node_changes_of_its_earlier_start(tmp_path, monkeypatch):
    """The batch script starts again with the plan's count (0); the earlier start shrank 2 -> 1, and
    this one runs on its whole allocation again: two changes, each said to the ranks."""
    stand_in_slurm(tmp_path, monkeypatch, split_row(2, 2, 8, 4, 1))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    earlier = [{"event": "step", "step": 1, "hosts": ["n1", "n2"], "slurm_start": 1},
               {"event": "failed", "step": 1, "slurm_start": 1}, "{cut short",
               {"event": "shrunk", "step": 2, "hosts": ["n1"], "slurm_start": 1},
               {"event": "step", "step": 2, "hosts": ["n1"], "slurm_start": 1}]
    (tmp_path / "slurm-steps.jsonl").write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n"
                                                        for e in earlier))
    assert slurm_steps.recorded_changes(str(tmp_path), 0) == (1, 1)
    assert slurm_steps.recorded_changes(str(tmp_path / "none"), 3) == (3, None)
    steps = slurm_steps.Steps(str(tmp_path), 2, sys.executable, 0, ["true"], min_nodes=1)
    assert steps.run(["n1", "n3"]) == 0
    assert (tmp_path / "steps.txt").read_text().splitlines() == ["n1,n3 2"]
    assert [(e["event"], e["slurm_start"]) for e in read_events(tmp_path)][-2:] == [("step", 2), ("succeeded", 2)]
