"""The launch plan: node ranks, rendezvous, environment, precedence, and purity."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import time

import pytest

from fsdpctl.backends import plan_run
from fsdpctl.backends.slurm.plan import SlurmPlan
from fsdpctl.errors import ProfileError, UsageError
from fsdpctl.plan.make import DEBUG_ENV, auto_port
from fsdpctl.plan.types import Overrides
from fsdpctl.profiles.loader import load_profile, parse_profile
from fsdpctl.rundir.paths import RUN_ID_PATTERN, make_run_id, new_run_id

RUN_ID = "two-node-20261121-120000-abcd"


def two_node(**overrides):
    return plan_run(load_profile("two-node").profile, run_id=RUN_ID, local_run_dir="runs/" + RUN_ID,
                    overrides=Overrides(**overrides))


def test_two_nodes_with_ranks_master_ip_and_network_env():
    plan = two_node()
    assert [n.node_rank for n in plan.nodes] == [0, 1]
    assert plan.num_nodes == 2
    assert plan.master_addr == "10.0.0.1" and plan.master_addr_is_ip
    # NCCL's exact-match form (a plain name is a prefix to NCCL); Gloo wants the plain name.
    assert plan.env["NCCL_SOCKET_IFNAME"] == "=eth0" and plan.env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert plan.env["NCCL_NET"] == "Socket" and plan.env["NCCL_IB_DISABLE"] == "1"


def test_a_profile_may_name_a_net_plugins_transport_with_ib_off():
    """ib: false selects NCCL's socket transport, unless the profile's env names another (EFA's
    aws-ofi-nccl is no InfiniBand but wants its plugin); the interface stays the network section's."""
    import dataclasses

    profile = load_profile("two-node").profile
    efa = dataclasses.replace(profile, env={**profile.env, "NCCL_NET": "AWS Libfabric"})
    plan = plan_run(efa, run_id=RUN_ID, local_run_dir="runs/" + RUN_ID, overrides=Overrides())
    assert plan.env["NCCL_NET"] == "AWS Libfabric" and plan.env["NCCL_IB_DISABLE"] == "1"
    with pytest.raises(ProfileError):
        parse_profile("name: x\nbackend: ssh\nhosts: [a]\nenv:\n  NCCL_SOCKET_IFNAME: eth1\n", "x.yaml")
    assert plan.env["PYTHONUNBUFFERED"] == "1" and "OMP_NUM_THREADS" in plan.env
    for node in plan.nodes:
        args = node.torchrun_args
        assert args[args.index("--rdzv-endpoint") + 1] == f"10.0.0.1:{auto_port(RUN_ID)}"
        assert args[args.index("--rdzv-id") + 1] == RUN_ID
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--local-addr") + 1] == node.address
        assert args[args.index("--log-dir") + 1] == f'"$FSDPCTL_RUN_DIR"/logs/node{node.node_rank}'
    assert plan.run_dir == f"~/fsdpctl/runs/{RUN_ID}"


def test_world_size_known_only_when_process_counts_are():
    assert two_node().world_size is None  # nproc_per_node: auto, no per-host gpus
    assert two_node(nproc_per_node=4).world_size == 8


def test_debug_adds_the_nccl_and_torch_debug_preset():
    assert not set(DEBUG_ENV) & set(two_node().env)
    env = two_node(debug=True).env
    assert {k: env[k] for k in DEBUG_ENV} == DEBUG_ENV


def test_precedence_flag_over_profile_over_default():
    plan = two_node()
    assert plan.train["steps"] == 500  # profile
    assert plan.train["batch_size"] == 16  # profile
    assert "lr" not in plan.train  # default applies on the node
    plan = two_node(train={"steps": 7}, master_port=31000)
    assert plan.train["steps"] == 7
    assert plan.master_port == 31000
    assert "10.0.0.1:31000" in plan.nodes[0].torchrun_args


def test_profile_env_overrides_defaults_but_not_the_network_section():
    text = ("name: p\nbackend: ssh\nhosts: [10.0.0.5]\nnproc_per_node: 2\n"
            "env:\n  OMP_NUM_THREADS: '8'\n  NCCL_DEBUG: WARN\n")
    plan = plan_run(parse_profile(text, "p.yaml"), run_id="p-20261121-120000-abcd", local_run_dir="r",
                    overrides=Overrides(debug=True))
    assert plan.env["OMP_NUM_THREADS"] == "8"
    assert plan.env["NCCL_DEBUG"] == "WARN"  # the profile said so explicitly
    assert plan.world_size == 2 and plan.master_addr == "10.0.0.5"


def test_hostname_master_is_kept_but_warned_about():
    plan = plan_run(parse_profile("name: p\nbackend: ssh\nhosts: [gpu-a, gpu-b]\n", "p.yaml"),
                    run_id="p-20261121-120000-abcd", local_run_dir="r")
    assert plan.master_addr == "gpu-a" and not plan.master_addr_is_ip
    assert any("host name" in w for w in plan.warnings)


def test_static_rendezvous_passes_node_rank_and_master():
    text = "name: p\nbackend: ssh\nhosts: [10.0.0.1, 10.0.0.2]\nrendezvous:\n  backend: static\n  port: 29600\n"
    plan = plan_run(parse_profile(text, "p.yaml"), run_id="p-20261121-120000-abcd", local_run_dir="r")
    args = plan.nodes[1].torchrun_args
    assert args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--master-addr") + 1] == "10.0.0.1"
    assert args[args.index("--master-port") + 1] == "29600"


@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_the_rendezvous_host_serves_the_store_under_either_backend(backend):
    """Static's store is served by node rank 0: a rendezvous host that is not the first host
    becomes node rank 0 there, so --master-addr is where the store is; c10d keeps the order."""
    text = (f"name: p\nbackend: ssh\nhosts: [10.0.0.1, 10.0.0.2, 10.0.0.3]\n"
            f"rendezvous:\n  backend: {backend}\n  host: 10.0.0.2\n  port: 29600\n")
    plan = plan_run(parse_profile(text, "p.yaml"), run_id="p-20261121-120000-abcd", local_run_dir="r")
    assert plan.master_addr == "10.0.0.2"
    order = [n.host for n in plan.nodes]
    if backend == "static":
        assert order == ["10.0.0.2", "10.0.0.1", "10.0.0.3"]
        for node in plan.nodes:
            args = node.torchrun_args
            assert args[args.index("--node-rank") + 1] == str(node.node_rank)
            assert args[args.index("--master-addr") + 1] == "10.0.0.2"
        assert plan.nodes[0].host == "10.0.0.2" and plan.nodes[0].node_rank == 0
    else:
        assert order == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        assert all("10.0.0.2:29600" in node.torchrun_args for node in plan.nodes)


def test_local_profile_uses_standalone_rendezvous_and_the_running_python():
    plan = plan_run(load_profile("local").profile, run_id="local-20261121-120000-abcd", local_run_dir="r",
                    local_python="/venv/bin/python")
    assert plan.python == "/venv/bin/python"
    assert "--standalone" in plan.nodes[0].torchrun_args and plan.world_size == 2


def test_slurm_plan_expands_rank_and_head_address_on_the_node():
    plan = plan_run(load_profile("slurm").profile, run_id="slurm-20261121-120000-abcd", local_run_dir="r",
                    home="/home/me", backend="slurm", overrides=Overrides(backend_options={"nodes": 3, "time": "10"}))
    slurm = SlurmPlan.of(plan)
    assert plan.backend == "slurm" and plan.num_nodes == 3 and plan.world_size == 24 and not plan.nodes
    assert plan.run_dir == "/home/me/fsdpctl/runs/slurm-20261121-120000-abcd"
    directives = dict(slurm.directives)
    assert directives["nodes"] == "3" and directives["time"] == "10" and directives["ntasks-per-node"] == "1"
    assert f'--rdzv-endpoint "$FSDPCTL_HEAD_ADDR":{plan.master_port}' in slurm.step_command
    assert 'logs/node"$SLURM_NODEID"' in slurm.step_command


def test_slurm_and_ssh_profiles_are_refused_by_the_wrong_command(tmp_path):
    import fsdpctl

    with pytest.raises(UsageError, match="runs through slurm, a scheduler") as refused:
        fsdpctl.launch("slurm", runs_dir=tmp_path)
    assert refused.value.hint == "use `fsdpctl submit --slurm --profile slurm`" and not list(tmp_path.iterdir())
    with pytest.raises(UsageError, match="no slurm section"):
        plan_run(load_profile("two-node").profile, run_id=RUN_ID, local_run_dir="r", backend="slurm")


def test_bad_override_and_plan_owned_setting_are_usage_errors():
    with pytest.raises(UsageError, match="both steps and epochs"):
        two_node(train={"epochs": 2})
    with pytest.raises(UsageError, match="set by fsdpctl"):
        two_node(train={"run_dir": "/tmp/x"})


def test_make_plan_is_pure(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("make_plan touched the network, the clock or a subprocess")

    profile = load_profile("two-node").profile
    monkeypatch.setattr(socket, "socket", forbidden)
    monkeypatch.setattr(socket, "getaddrinfo", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(time, "time", forbidden)
    first = plan_run(profile, run_id=RUN_ID, local_run_dir="r")
    second = plan_run(profile, run_id=RUN_ID, local_run_dir="r")
    assert first == second


def test_auto_port_differs_between_runs_and_stays_below_ephemeral_ports():
    ports = {auto_port(new_run_id("lab")) for _ in range(200)}
    assert len(ports) > 150 and all(20000 <= p < 30000 for p in ports)


def test_run_ids():
    assert make_run_id("lab", dt.datetime(2026, 11, 21, 9, 5, 7), "0a1b") == "lab-20261121-090507-0a1b"
    ids = {new_run_id("lab") for _ in range(50)}
    assert len(ids) == 50 and all(RUN_ID_PATTERN.match(i) for i in ids)
    with pytest.raises(ValueError):
        make_run_id("lab", dt.datetime(2026, 1, 1), "zz")


def test_a_users_program_is_timed_by_the_start_up_hook_unless_turned_off(tmp_path):
    """Telemetry is on for a program of the user's (the bundled workload times itself), off with
    --no-telemetry or the profile's telemetry.enabled, and carries the tokens and FLOPs given."""
    assert "FSDPCTL_TELEMETRY" not in two_node().env
    plan = two_node(command=("train.py",))
    assert plan.env["FSDPCTL_TELEMETRY"] == "1" and "FSDPCTL_TOKENS_PER_STEP" not in plan.env
    assert "TORCH_NCCL_ENABLE_TIMING" not in plan.env  # its cost is not measured on a GPU yet
    assert two_node(command=("train.py",), telemetry=False).env["FSDPCTL_TELEMETRY"] == "0"
    given = two_node(command=("train.py",), tokens_per_step=65536, flops_per_token=7.5e8).env
    assert given["FSDPCTL_TOKENS_PER_STEP"] == "65536" and float(given["FSDPCTL_FLOPS_PER_TOKEN"]) == 7.5e8
    path = tmp_path / "timed.yaml"
    path.write_text("name: timed\nhosts: [a, b]\ntelemetry:\n  enabled: false\n  nccl_timing: true\n")
    off = plan_run(load_profile(str(path)).profile, run_id=RUN_ID, local_run_dir="r",
                   overrides=Overrides(command=("train.py",)))
    assert off.env["FSDPCTL_TELEMETRY"] == "0" and "TORCH_NCCL_ENABLE_TIMING" not in off.env
    path.write_text("name: timed\nhosts: [a, b]\ntelemetry:\n  nccl_timing: true\n  tokens_per_step: 0\n")
    with pytest.raises(ProfileError, match=r"telemetry\.tokens_per_step: 0 is not positive"):
        load_profile(str(path))
    path.write_text("name: timed\nhosts: [a, b]\ntelemetry:\n  nccl_timing: true\n")
    timed = plan_run(load_profile(str(path)).profile, run_id=RUN_ID, local_run_dir="r",
                     overrides=Overrides(command=("train.py",)))
    assert timed.env["TORCH_NCCL_ENABLE_TIMING"] == "1"
    with pytest.raises(UsageError, match="--tokens-per-step -1: not positive"):
        from fsdpctl.job import JobOptions

        JobOptions(command=("train.py",), tokens_per_step=-1)
