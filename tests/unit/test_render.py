"""Rendered scripts: golden files, `bash -n`, and real execution proving values stay inert.

Golden files are rewritten with FSDPCTL_UPDATE_GOLDEN=1 (then review the diff).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from fsdpctl.backends import plan_run, render_scripts
from fsdpctl.plan.types import CodePlan, Overrides
from fsdpctl.profiles.loader import load_profile, parse_profile
from fsdpctl.shell import NodeExpr, quote_path

GOLDEN = Path(__file__).parent / "golden"
USER_CODE = CodePlan(source="/home/me/project", files=3, bytes=4096, largest=(("train.py", 2048),), origin="git")
USER_JOB = Overrides(command=("train.py", "--config", "conf/a b.yaml", "$(id)"), code=USER_CODE,
                     requirements=("numpy>=1.24",), secrets=("HF_TOKEN",))
CASES = {
    "two-node": dict(),
    "slurm": dict(backend="slurm"),
    "slurm-requeue": dict(backend="slurm", overrides=Overrides(backend_options={"requeue": True})),
    "local": dict(),
    "two-node-user": dict(overrides=USER_JOB),
    "slurm-user": dict(backend="slurm", overrides=USER_JOB),
}
NASTY = """$(touch PWNED); `touch PWNED2` "x' y" ; rm -rf / #"""


def rendered(name: str) -> dict[str, str]:
    profile = load_profile(name.removesuffix("-requeue").removesuffix("-user")).profile
    plan = plan_run(profile, run_id=f"{name}-20261121-120000-abcd",
                    local_run_dir="runs/x",
                    local_python="/opt/venv/bin/python", home="/home/me", local_cwd="/home/me/project",
                    **CASES[name])
    return render_scripts(plan)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_and_bash_syntax(name, tmp_path):
    for file_name, text in rendered(name).items():
        golden = GOLDEN / f"{name}.{file_name}"
        if os.environ.get("FSDPCTL_UPDATE_GOLDEN") == "1":
            golden.write_text(text)
        assert text == golden.read_text(), f"{golden} differs; FSDPCTL_UPDATE_GOLDEN=1 rewrites it"
        script = tmp_path / file_name
        script.write_text(text)
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_quote_path_lets_only_a_leading_tilde_expand():
    assert quote_path("~/a b") == "\"$HOME\"/'a b'"
    assert quote_path("/x/~y") == "'/x/~y'"
    assert quote_path("$(id)") == "'$(id)'"


FAKE_PYTHON = """\
#!/usr/bin/env python3
import json, os, sys
out = os.environ["FAKE_OUT"]
if sys.argv[1:3] == ["-m", "fsdpctl.node.gpu_watch"]:  # the GPU watcher beside torchrun: its own record
    open(os.path.join(out, "watch%s.json" % os.environ.get("FSDPCTL_NODE_RANK", "x")), "w").write(json.dumps(sys.argv))
    sys.exit(0)
record = {"argv": sys.argv[1:], "cwd": os.getcwd(),
          "env": {k: v for k, v in os.environ.items()
                  if k.startswith(("FSDPCTL_", "NASTY", "NCCL_", "GLOO_", "PYTHONPATH"))}}
with open(os.path.join(out, "node%s.json" % os.environ.get("FSDPCTL_NODE_RANK", "x")), "w") as f:
    json.dump(record, f)
"""


def fake_python(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "python"
    path.parent.mkdir(exist_ok=True)
    path.write_text(FAKE_PYTHON)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def nasty_profile(tmp_path: Path, extra: str = "") -> str:
    python = fake_python(tmp_path)
    return textwrap.dedent(f"""\
        name: nasty
        backend: ssh
        hosts: [10.9.0.1, 10.9.0.2]
        nproc_per_node: 2
        python: {python}
        workdir: {tmp_path}/work
        env:
          NASTY: {json.dumps(NASTY)}
        network:
          interface: eth0
        train:
          dataset: {json.dumps(NASTY)}
        """) + extra


def test_node_script_passes_nasty_values_verbatim_and_runs_nothing(tmp_path):
    profile = parse_profile(nasty_profile(tmp_path), "nasty.yaml")
    plan = plan_run(profile, run_id="nasty-20261121-120000-abcd", local_run_dir="r")
    out = tmp_path / "out"
    out.mkdir()
    for file_name, text in render_scripts(plan).items():
        script = tmp_path / file_name
        script.write_text(text)
        result = subprocess.run(["bash", str(script)], cwd=tmp_path, env={**os.environ, "FAKE_OUT": str(out)},
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
    run_dir = str(tmp_path / "work" / "runs" / plan.run_id)
    for node in plan.nodes:
        record = json.loads((out / f"node{node.node_rank}.json").read_text())
        # Node-side words (the log folder) expand on the node; every other word arrives verbatim.
        assert record["argv"] == [a.replace('"$FSDPCTL_RUN_DIR"', run_dir) if isinstance(a, NodeExpr) else a
                                  for a in node.torchrun_args]
        assert record["env"]["PYTHONPATH"] == f"{run_dir}/pkg/fsdpctl/node/startup:{run_dir}/pkg"
        assert record["env"]["FSDPCTL_RUN_DIR"] == run_dir
        assert record["env"]["NASTY"] == NASTY
        assert record["argv"][record["argv"].index("--dataset") + 1] == NASTY
        assert record["cwd"] == str(tmp_path / "work" / "runs" / plan.run_id)
        assert record["env"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert not list(tmp_path.rglob("PWNED*"))


FAKE_SCONTROL = """\
#!/usr/bin/env bash
case "$1 $2" in
  "show hostnames") printf 'n1\\nn2\\n' ;;
  "show node") echo "NodeName=$3 Arch=x86_64 CoresPerSocket=1"; echo "   NodeAddr=10.9.0.${3#n} NodeHostName=$3" ;;
esac
"""
# Runs the step once per node, as Slurm would, with that node's SLURM_NODEID.
FAKE_SRUN = """\
#!/usr/bin/env bash
while [ "$1" != bash ]; do shift; done
for id in 0 1; do SLURM_NODEID=$id "$@" || exit $?; done
"""


def test_sbatch_script_expands_node_rank_inside_each_step(tmp_path):
    profile = parse_profile(nasty_profile(tmp_path, "slurm:\n  nodes: 2\n").replace("backend: ssh", "backend: slurm"),
                            "nasty.yaml")
    plan = plan_run(profile, run_id="nasty-20261121-120000-abcd", local_run_dir="r", backend="slurm")
    script = tmp_path / "sbatch.sh"
    script.write_text(render_scripts(plan)["sbatch.sh"])
    bin_dir = tmp_path / "bin"
    for name, body in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_OUT": str(out),
           "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7"}
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "head n1 (10.9.0.1)" in result.stdout
    for rank in (0, 1):
        record = json.loads((out / f"node{rank}.json").read_text())
        argv = record["argv"]
        assert argv[argv.index("--rdzv-endpoint") + 1] == f"10.9.0.1:{plan.master_port}"
        assert argv[argv.index("--log-dir") + 1] == f"{tmp_path}/work/runs/{plan.run_id}/logs/node{rank}"
        assert argv[argv.index("--dataset") + 1] == NASTY
        assert record["env"]["FSDPCTL_NODE_RANK"] == str(rank)
        assert record["env"]["NASTY"] == NASTY
    assert not list(tmp_path.rglob("PWNED*"))


def test_bash_is_available():
    assert shutil.which("bash"), "the rendered scripts are bash scripts"


# scontrol that also records requeue calls; srun that plays the step's outcome (and marker) it is told.
FAKE_SCONTROL_REQUEUE = FAKE_SCONTROL.replace('esac', '  "requeue "*) echo "$2" >> "$FAKE_OUT/requeued" ;;\nesac')
FAKE_SRUN_OUTCOME = """\
#!/usr/bin/env bash
[ -n "${FAKE_MARKER:-}" ] && echo '{"step": 5}' > "$FSDPCTL_RUN_DIR/requeue-requested"
exit "${FAKE_EXIT:-0}"
"""


@pytest.mark.parametrize("stale,marker,srun_exit,requeued,exit_code", [
    (False, True, 0, True, 0),    # saved on SIGUSR2: requeue
    (False, False, 0, False, 0),  # finished
    (True, False, 0, False, 0),   # an earlier attempt's marker, and this attempt finished: no requeue
    (True, False, 1, False, 1),   # an earlier attempt's marker, and this attempt failed: no requeue
    (False, True, 1, False, 1),   # a marker but a failed step: no requeue
])
def test_requeue_batch_script_requeues_only_a_clean_stop_with_a_fresh_marker(tmp_path, stale, marker, srun_exit,
                                                                                requeued, exit_code):
    profile = parse_profile(f"name: q\nbackend: slurm\nworkdir: {tmp_path}/w\nslurm:\n  nodes: 2\n  time: '60'\n",
                            "q.yaml")
    plan = plan_run(profile, run_id="q-20261121-120000-abcd", local_run_dir="r", backend="slurm",
                    overrides=Overrides(backend_options={"requeue": True}))
    run_dir = Path(plan.run_dir)
    run_dir.mkdir(parents=True)
    if stale:
        (run_dir / "requeue-requested").write_text("{}")
    script = tmp_path / "sbatch.sh"
    script.write_text(render_scripts(plan)["sbatch.sh"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("scontrol", FAKE_SCONTROL_REQUEUE), ("srun", FAKE_SRUN_OUTCOME)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_OUT": str(tmp_path),
           "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7", "FAKE_EXIT": str(srun_exit),
           "FAKE_MARKER": "1" if marker else ""}
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == exit_code, result.stderr
    assert (tmp_path / "requeued").exists() == requeued
    if requeued:
        assert (tmp_path / "requeued").read_text() == "7\n" and "requeueing it" in result.stdout


def test_the_node_script_template_is_compiled_once_for_every_node_of_a_large_plan(tmp_path, monkeypatch):
    """A 1,024-node launch renders 1,024 node scripts: compiled again for each, the template cost
    0.1 s a node of the launcher's CPU."""
    import jinja2

    from fsdpctl.plan import render

    hosts = "".join(f"  - 10.0.{i // 250}.{i % 250 + 1}\n" for i in range(300))
    profile = parse_profile(f"name: big\nbackend: ssh\nhosts:\n{hosts}nproc_per_node: 1\n", "big.yaml")
    plan = plan_run(profile, run_id="big-20261129-120000-abcd", local_run_dir=str(tmp_path / "run"))
    render._environment.cache_clear()
    compiled = []
    real = jinja2.Environment.compile
    monkeypatch.setattr(jinja2.Environment, "compile", lambda self, *a, **k: compiled.append(a) or real(self, *a, **k))
    scripts = render_scripts(plan)
    assert len(scripts) == 300 and "FSDPCTL_NODE_RANK=299" in scripts["node299.sh"].replace("'", "")
    assert len(compiled) == 1
