"""Hosts with different process counts and chosen GPUs: the profile's fields and their errors, the
plan's per-node counts, world size and CUDA_VISIBLE_DEVICES, ``--exclude HOST:GPU``, and doctor's GPU
check on the chosen ones (a real 2+1 run is tests/integration/test_user_script.py's module-form test)."""

from __future__ import annotations

import pytest

from fsdpctl.backends import plan_run, render_scripts
from fsdpctl.errors import ProfileError, UsageError
from fsdpctl.hostcheck.checks import judge_host
from fsdpctl.hostpool.placing import place_hosts, split_exclude
from fsdpctl.plan.types import Overrides
from fsdpctl.profiles.loader import parse_profile

RUN_ID = "mixed-20261128-120000-abcd"
HEAD = "name: mixed\nbackend: ssh\n"


def profile(hosts: str, rest: str = ""):
    return parse_profile(f"{HEAD}hosts:\n{hosts}{rest}", "mixed.yaml")


def plan_of(prof, **overrides):
    return plan_run(prof, run_id=RUN_ID, local_run_dir="runs/" + RUN_ID, overrides=Overrides(**overrides))


def nproc_args(plan) -> list[str]:
    return [n.torchrun_args[n.torchrun_args.index("--nproc-per-node") + 1] for n in plan.nodes]


def test_two_ranks_on_one_cpu_host_and_one_on_the_other():
    plan = plan_of(profile("  - {host: 10.0.0.1, nproc: 2}\n  - {host: 10.0.0.2, nproc: 1}\n", "device: cpu\n"))
    assert nproc_args(plan) == ["2", "1"] and plan.world_size == 3 and plan.nproc_per_node == "2+1"
    assert all("CUDA_VISIBLE_DEVICES" not in n.env for n in plan.nodes)
    assert plan_of(profile("  - {host: 10.0.0.1, nproc: 2}\n  - 10.0.0.2\n", "nproc_per_node: 4\n")).world_size == 6
    assert plan_of(profile("  - {host: 10.0.0.1, nproc: 2}\n  - {host: 10.0.0.2, nproc: 1}\n", "device: cpu\n"),
                   nproc_per_node=3).world_size == 6  # --nproc-per-node is over every host's


def test_chosen_gpus_set_cuda_visible_devices_in_nvidia_smis_order():
    prof = profile("  - {host: 10.0.0.1, gpus: [2, 4]}\n  - {host: 10.0.0.2, gpus: 8}\n")
    plan = plan_of(prof)
    assert nproc_args(plan) == ["2", "8"] and plan.world_size == 10
    first, second = plan.nodes
    assert first.gpus == (2, 4) and second.gpus == ()
    assert first.env["CUDA_VISIBLE_DEVICES"] == "2,4" and first.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_VISIBLE_DEVICES" not in second.env
    scripts = render_scripts(plan)
    assert "export CUDA_VISIBLE_DEVICES=2,4  # this node's own" in scripts["node0.sh"]
    assert "--gpus 2,4" in scripts["node0.sh"] and "--gpus" not in scripts["node1.sh"]  # its GPU samples
    # a profile's own order wins; one rank per chosen GPU unless nproc says fewer
    own = profile("  - {host: 10.0.0.1, gpus: [1, 3], nproc: 1}\n", "env: {CUDA_DEVICE_ORDER: FASTEST_FIRST}\n")
    node = plan_of(own).nodes[0]
    assert node.nproc == "1" and "CUDA_DEVICE_ORDER" not in node.env
    with pytest.raises(UsageError, match=r"--nproc-per-node 3: 10.0.0.1 runs on 2 chosen GPU\(s\) \(1,3\)"):
        plan_of(own, nproc_per_node=3)


@pytest.mark.parametrize(("hosts", "rest", "said"), [
    ("  - {host: a, gpus: []}\n", "", "hosts[0].gpus: is an empty list"),
    ("  - {host: a, gpus: [0, -1]}\n", "", "hosts[0].gpus: [0, -1] holds a negative index"),
    ("  - {host: a, gpus: [1, 1]}\n", "", "hosts[0].gpus: [1, 1] names a GPU twice"),
    ("  - {host: a, gpus: [0, 1], nproc: 3}\n", "", "hosts[0].nproc: 3 ranks on the 2 GPU(s) of gpus [0, 1]"),
    ("  - {host: a, nproc: 0}\n", "", "hosts[0].nproc: 0 is not positive"),
    ("  - {host: a, gpus: [0]}\n", "device: cpu\nnproc_per_node: 1\n", "hosts[0].gpus: names GPUs but device is cpu"),
    ("  - {host: a, gpus: [0]}\n", "env: {CUDA_VISIBLE_DEVICES: '1'}\n", "env.CUDA_VISIBLE_DEVICES: is set"),
    ("  - {host: a, gpus: two}\n", "", "hosts[0].gpus: 'two' is not"),
    ("  - a\n  - {host: b, nproc: 1}\n", "device: cpu\n", "nproc_per_node: auto counts GPUs but device is cpu"),
])
def test_bad_gpu_and_process_fields_say_where_and_the_fix(hosts, rest, said):
    with pytest.raises(ProfileError) as caught:
        profile(hosts, rest)
    assert said in str(caught.value) and "mixed.yaml" in str(caught.value)


def test_hybrid_sharding_is_refused_on_uneven_nodes():
    prof = profile("  - {host: 10.0.0.1, nproc: 2}\n  - {host: 10.0.0.2, nproc: 1}\n", "device: cpu\n")
    with pytest.raises(UsageError, match="--sharding hybrid: the nodes run different numbers of ranks"):
        plan_of(prof, train={"sharding": "hybrid"})


def test_exclude_one_gpu_of_one_host():
    prof = profile("  - {host: n1, gpus: 4}\n  - {host: n2, gpus: [0, 2, 3], nproc: 3}\n  - 'fe80::1'\n")
    assert split_exclude(prof, ["n1:3", "n2", "fe80::1"]) == (["n2", "fe80::1"], {"n1": [3]})
    placed = place_hosts(prof, ["n1:3", "n2:2"]).profile
    assert [h.gpus for h in placed.hosts[:2]] == [(0, 1, 2), (0, 3)] and placed.hosts[1].nproc == 2
    plan = plan_of(placed)
    assert nproc_args(plan)[:2] == ["3", "2"] and plan.nodes[0].env["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    for exclude, said in (["n1:7"], "--exclude n1:7: not one of n1's GPUs (0, 1, 2, 3)"), \
                         (["n2:0", "n2:2", "n2:3"], "--exclude n2:0: leaves n2 no GPU"), \
                         (["n9:0"], "--exclude n9:0: not a host of profile mixed"), \
                         (["fe80::1:0"], "--exclude fe80::1:0: profile mixed does not say which GPUs fe80::1 has"):
        with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
            place_hosts(prof, exclude)
    unknown = profile("  - n1\n")
    with pytest.raises(UsageError, match="does not say which GPUs n1 has") as caught:
        place_hosts(unknown, ["n1:3"])
    assert "gpus: 8" in caught.value.hint


def _facts(count: int) -> dict:
    return {"python": {"path": "/usr/bin/python3", "version": "3.12.3"}, "torch": {"installed": True,
            "version": "2.11.0", "cuda": "13.0", "fsdp2_exported": True}, "gpus": {"count": count, "driver": "580.1"},
            "interfaces": {}, "disk": {}}


def test_doctor_judges_the_chosen_gpus():
    prof = profile("  - {host: n1, gpus: [2, 4]}\n")
    checks = {c.name: c for c in judge_host(prof, _facts(8), 2, gpus=(2, 4))}
    assert checks["gpus"].status == "pass" and checks["gpus"].detail.startswith("GPUs 2, 4 of 8")
    short = {c.name: c for c in judge_host(prof, _facts(4), 2, gpus=(2, 4))}["gpus"]
    assert short.status == "fail" and "GPU 4 is chosen (gpus [2, 4]) and this host has 4 GPU(s)" in short.detail
    assert "0-3" in short.hint
    uneven = {c.name: c for c in judge_host(prof, _facts(2), 3)}["gpus"]  # a host's own nproc above its GPUs
    assert uneven.status == "warn" and "2 GPU(s) found, 3 needed" in uneven.detail


def test_estimate_counts_the_ranks_of_uneven_hosts():
    from fsdpctl.api.estimate import _uneven_world

    assert _uneven_world(profile("  - {host: a, gpus: [0, 1, 2]}\n  - {host: b, gpus: 8}\n"), None) == 11
    assert _uneven_world(profile("  - {host: a, nproc: 2}\n  - b\n", "nproc_per_node: 4\n"), None) == 6
    assert _uneven_world(profile("  - a\n  - b\n", "nproc_per_node: 4\n"), None) is None  # even: nodes x nproc
    assert _uneven_world(profile("  - {host: a, nproc: 2}\n  - b\n"), None) is None  # b counts at run time
