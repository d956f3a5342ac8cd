"""A Slurm job holding spare nodes: its batch script, and the decisions ``fsdpctl.node.slurm_steps``
makes after a failed step (which node is to blame, which spare takes its place), as pure functions."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fsdpctl.backends.slurm.scripts import render_sbatch_script
from fsdpctl.backends.slurm.steps import json_lines, recovery_of, replacements_of
from fsdpctl.errors import UsageError
from fsdpctl.node import slurm_steps
from fsdpctl.profiles.loader import parse_profile
from tests.unit.test_slurm_plan import slurm_plan

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


def test_status_reads_the_replacement_and_what_it_cost():
    events = json_lines("\n".join(json.dumps(e) for e in [
        {"event": "step", "step": 1, "hosts": ["n1", "n2"], "at_s": 100.0},
        {"event": "failed", "step": 1, "blamed": {"n2": "failed the re-check: gone"}, "last_step": 14,
         "last_step_at": 110.0, "at_s": 125.0},
        {"event": "replaced", "step": 2, "hosts": ["n1", "n3"], "from_step": 10, "at_s": 125.1,
         "replacements": [{"host": "n2", "by": "n3", "why": "failed the re-check: gone"}]},
    ]) + '\n{"cut sh')
    metrics = [{"kind": "train", "step": 14, "time": 110.0}, {"kind": "train", "step": 12, "time": 131.5},
               {"kind": "train", "step": 14, "time": 132.0}]
    [replaced] = replacements_of(events)
    assert replaced.describe() == "n3 in the place of n2 (failed the re-check: gone)"
    recovery = recovery_of(events, metrics)
    assert recovery is not None and recovery.steps_redone == 4 and recovery.stood_still_s == pytest.approx(21.5)
    assert recovery_of(events[:2], metrics) is None  # no replacement yet
