"""The command line as a user runs it: in a subprocess, reading stdout, stderr and the exit code."""

from __future__ import annotations

import json
import re

from fsdpctl.plan.make import auto_port
from tests.conftest import REPO, run_cli


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("fsdpctl ")


def test_launch_dry_run_two_node_prints_both_nodes():
    result = run_cli("launch", "--profile", "two-node", "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "# ---- node0.sh ----" in out and "# ---- node1.sh ----" in out
    assert "export FSDPCTL_NODE_RANK=0" in out and "export FSDPCTL_NODE_RANK=1" in out
    assert re.search(r"--rdzv-endpoint 10\.0\.0\.1:2\d{4} ", out)  # rendezvous.port: auto
    assert "export NCCL_SOCKET_IFNAME==eth0" in out and "export GLOO_SOCKET_IFNAME=eth0" in out
    assert "export NCCL_NET=Socket" in out  # ib: false, whatever net plugin a node has
    assert "export NCCL_IB_DISABLE=1" in out
    assert not (REPO / "runs").exists() or not any((REPO / "runs").glob("two-node-*")), "dry run wrote files"


def test_launch_dry_run_json_matches_the_plan():
    result = run_cli("launch", "--profile", "two-node", "--dry-run", "--json", "--steps", "9", "--set", "lr=0.01")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    plan = data["plan"]
    assert [n["node_rank"] for n in plan["nodes"]] == [0, 1]
    assert plan["master_addr"] == "10.0.0.1" and plan["master_port"] == auto_port(plan["run_id"])
    assert plan["env"]["NCCL_SOCKET_IFNAME"] == "=eth0"  # exact match: not eth0.100
    assert plan["train"]["steps"] == 9 and plan["train"]["lr"] == 0.01
    assert set(data["scripts"]) == {"node0.sh", "node1.sh"}
    assert "--steps 9" in data["scripts"]["node1.sh"]


def test_submit_slurm_dry_run_prints_the_batch_script():
    result = run_cli("submit", "--slurm", "--profile", "slurm", "--dry-run", "--nodes", "4")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --nodes=4" in result.stdout
    assert "srun --kill-on-bad-exit=1" in result.stdout
    assert "'cd \"$FSDPCTL_RUN_DIR\" && export FSDPCTL_NODE_RANK=\"$SLURM_NODEID\"" in result.stdout


def bad_profile(tmp_path, body: str):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    return path


def assert_one_line_error(result, *words):
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_bad_profiles_give_one_line_and_exit_2(tmp_path):
    typo = bad_profile(tmp_path, "name: x\nbackend: ssh\nhosts: [n1]\nnetwork:\n  interfce: eth0\n")
    assert_one_line_error(run_cli("launch", "-p", str(typo), "--dry-run"), "bad.yaml:5:", "network.interfce",
                          "did you mean 'interface'")
    wrong_type = bad_profile(tmp_path, "name: x\nbackend: ssh\nhosts: [n1]\nnproc_per_node: 2\nrendezvous:\n"
                                       "  port: '29500'\n")
    assert_one_line_error(run_cli("launch", "-p", str(wrong_type), "--dry-run"), "bad.yaml:6:", "rendezvous.port")
    injection = bad_profile(tmp_path, 'name: x\nbackend: ssh\nhosts: ["a;rm -rf /"]\n')
    assert_one_line_error(run_cli("launch", "-p", str(injection), "--dry-run"), "bad.yaml:3:", "hosts[0]")


def test_bad_flag_value_is_one_error_with_hint():
    result = run_cli("launch", "-p", "local", "--dry-run", "--set", "lr=abc")
    assert result.returncode == 2
    assert "error: --lr: 'abc' is not a number" in result.stderr and "hint:" in result.stderr
    unknown = run_cli("launch", "-p", "nope", "--dry-run")
    assert unknown.returncode == 2 and "no such profile" in unknown.stderr


def test_hang_options_are_checked_and_land_in_the_plan():
    short = run_cli("launch", "-p", "local", "--dry-run", "--hang-timeout", "3")
    assert short.returncode == 2 and "--hang-timeout 3: too short" in short.stderr and "hint:" in short.stderr
    wrong = run_cli("launch", "-p", "local", "--dry-run", "--on-hang", "wait")
    assert wrong.returncode == 2 and "--on-hang 'wait': not stop or keep" in wrong.stderr
    plan = json.loads(run_cli("launch", "-p", "local", "--dry-run", "--json", "--hang-timeout", "600", "--on-hang",
                              "keep").stdout)["plan"]
    assert plan["hang_timeout"] == 600 and plan["on_hang"] == "keep"
    assert json.loads(run_cli("launch", "-p", "local", "--dry-run", "--json").stdout)["plan"]["hang_timeout"] is None


def test_resume_and_restart_flags_are_refused_where_they_cannot_apply(tmp_path):
    env = {"FSDPCTL_RUNS_DIR": str(tmp_path)}
    fetched = run_cli("launch", "-p", "local", "--detach", "--fetch", "outputs", env=env)
    assert fetched.returncode == 2 and "--fetch: a detached launch does not wait for the end" in fetched.stderr
    changed = run_cli("launch", "--resume", "local-20261121-120000-abcd", "--fsdp", "1", env=env)
    assert changed.returncode == 2 and "--fsdp: --resume continues the run with its own plan" in changed.stderr
    command = run_cli("launch", "--resume", "local-20261121-120000-abcd", "--", "train.py", env=env)
    assert command.returncode == 2 and "-- COMMAND: --resume continues the run" in command.stderr
    unknown = run_cli("submit", "--slurm", "--resume", "nosuchrun", env=env)
    assert unknown.returncode == 2 and "error: run nosuchrun: not found" in unknown.stderr
    plan = json.loads(run_cli("launch", "-p", "local", "--dry-run", "--json", "--max-restarts", "3").stdout)["plan"]
    assert plan["max_restarts"] == 3 and plan["attempt"] == 1 and plan["env"]["FSDPCTL_ATTEMPT"] == "1"
    for result in (fetched, changed, command, unknown):
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 2


def test_stacks_of_an_unknown_run_is_one_line(tmp_path):
    result = run_cli("stacks", "nosuchrun", env={"FSDPCTL_RUNS_DIR": str(tmp_path)})
    assert result.returncode == 2 and "error: run nosuchrun: not found" in result.stderr
    assert "Traceback" not in result.stderr


def test_debug_env_shows_the_traceback(tmp_path):
    path = bad_profile(tmp_path, "name: x\nbackend: ssh\n")
    result = run_cli("launch", "-p", str(path), "--dry-run", env={"FSDPCTL_DEBUG": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_render_writes_plan_and_scripts(tmp_path):
    result = run_cli("render", "-p", "two-node", "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["node0.sh", "node1.sh", "plan.json"]
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["profile_name"] == "two-node"


def test_profiles_lists_shipped_profiles(tmp_path, isolated_home):
    result = run_cli("profiles", cwd=tmp_path, env={"HOME": str(isolated_home)})
    assert result.returncode == 0, result.stderr
    names = {line.split("\t")[0] for line in result.stdout.splitlines()}
    assert {"local", "two-node", "slurm"} <= names
    assert all("\tshipped\t" in line for line in result.stdout.splitlines())
