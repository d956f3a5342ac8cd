"""A launch from start to end: preflight, stage and start every node, supervise, collect, record.

The CLI calls these in order; each step leaves the run directory describing what happened, so
``logs``/``status``/``stop`` work on it later, from another terminal too.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .connect import master_of, node_python
from .doctor import DoctorReport, make_jobs, run_doctor
from .nodes import NodeRun, RunResult, Supervisor, fetch_logs, start_run, stop_run
from .plan import LaunchPlan
from .profile_schema import ClusterProfile
from .profiles import parse_profile
from .runs import RunPaths, read_json, write_json_atomic
from .transport import Transport

PREFLIGHT_TIMEOUT = 20.0


def now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def preflight(profile: ClusterProfile, plan: LaunchPlan, transports: Sequence[Transport],
              on_host: Callable | None = None) -> DoctorReport:
    """doctor's fast checks on the plan's own hosts and rendezvous port (connections are kept)."""
    master_rank, master_addr = master_of(profile)
    port_check = profile.backend == "ssh" and plan.num_nodes > 1
    jobs = make_jobs(profile, transports, master_rank, master_addr, plan.master_port, deep=False,
                     port_check=port_check)
    nproc = int(plan.nproc_per_node) if plan.nproc_per_node.isdigit() else None
    return run_doctor(profile, jobs, python=node_python(profile), timeout=PREFLIGHT_TIMEOUT, nproc=nproc,
                      on_host=on_host)


def record(paths: RunPaths, plan: LaunchPlan, runs: Sequence[NodeRun] | None, state: str,
           **extra: Any) -> dict[str, Any]:
    """Write run.json: the run's state, each node's process id and state, and whatever ``extra`` says."""
    data = read_json(paths.run_record)
    data.update({
        "run_id": plan.run_id, "profile": plan.profile_name, "backend": plan.backend, "state": state,
        "run_dir_on_nodes": plan.run_dir, "num_nodes": plan.num_nodes, "world_size": plan.world_size,
    })
    if runs is not None:
        data["nodes"] = [{"node_rank": r.rank, "host": r.node.host, "pid": r.pid, "state": r.state,
                          "exit_code": r.exit_code} for r in runs]
    data.update(extra)
    write_json_atomic(paths.run_record, data)
    return data


def prepare(paths: RunPaths, plan: LaunchPlan, scripts: dict[str, str], profile_text: str) -> None:
    """The local run directory: plan, scripts, the profile as it was, and a first run.json."""
    write_json_atomic(paths.plan, plan.to_json())
    paths.scripts.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        paths.script(name).write_text(text, encoding="utf-8")
    (paths.root / "profile.yaml").write_text(profile_text, encoding="utf-8")
    paths.logs.mkdir(parents=True, exist_ok=True)
    record(paths, plan, None, "starting", created_at=now())


def start(paths: RunPaths, plan: LaunchPlan, scripts: dict[str, str], transports: Sequence[Transport],
          detached: bool) -> list[NodeRun]:
    """Stage and start every node, and record their process ids."""
    runs = start_run(plan, scripts, transports)
    record(paths, plan, runs, "running", started_at=now(), detached=detached)
    return runs


def supervise(paths: RunPaths, plan: LaunchPlan, runs: list[NodeRun], sink) -> RunResult:
    """Follow the run to its end (fail-fast, Ctrl-C), collect the nodes' logs, record the outcome."""
    result = Supervisor(plan, runs, paths.logs, sink).run()
    if result.first_failure and result.first_failure.get("error_file"):
        result.first_failure["error"] = read_error_file(runs[result.first_failure["node_rank"]].transport,
                                                        result.first_failure["error_file"])
    if Path(plan.run_dir).expanduser().resolve() != paths.root.resolve():
        fetch_logs(plan, runs, paths.root)
    state = "interrupted" if result.interrupted else ("failed" if result.exit_code else "succeeded")
    record(paths, plan, runs, state, finished_at=now(), exit_code=result.exit_code,
           first_failure=result.first_failure)
    return result


def read_error_file(transport: Transport, path: str) -> str | None:
    """The message of a failed rank's torchelastic error file (written by @record), read on its node."""
    from .errors import HostError
    from .shell import after_mark, marked, quote_path

    try:
        _, out, _ = transport.run(marked(f"cat {quote_path(path)} 2>/dev/null"), 30)
        message = json.loads(after_mark(out)).get("message", {})
    except (HostError, ValueError, AttributeError):
        return None
    text = message.get("message") if isinstance(message, dict) else message
    return str(text).strip().splitlines()[-1] if text else None


def load_run(run_dir: Path) -> tuple[LaunchPlan, ClusterProfile, dict[str, Any]]:
    """A run directory's plan (as a LaunchPlan), its profile, and run.json."""
    from .plan import NodeSpec, SlurmPlan

    data = read_json(run_dir / "plan.json")
    nodes = tuple(NodeSpec(**{**n, "torchrun_args": tuple(n["torchrun_args"])}) for n in data.pop("nodes", []))
    slurm = data.pop("slurm", None)
    plan = LaunchPlan(**{**data, "nodes": nodes, "setup": tuple(data.get("setup", ())),
                         "warnings": tuple(data.get("warnings", ())),
                         "slurm": SlurmPlan(**{**slurm, "directives": tuple(map(tuple, slurm["directives"]))})
                         if slurm else None})
    profile = parse_profile((run_dir / "profile.yaml").read_text(encoding="utf-8"), str(run_dir / "profile.yaml"))
    return plan, profile, read_json(run_dir / "run.json")


def stop(run_dir: Path, transports: Sequence[Transport]) -> dict[str, str]:
    """End every process of a run on every node and record it as stopped."""
    plan, _, data = load_run(run_dir)
    if data.get("backend") == "slurm":
        from .slurm import cancel

        cancel(data["job_id"])
        record(RunPaths(run_dir), plan, None, "stopped", stopped_at=now())
        return {f"Slurm job {data['job_id']}": ""}
    remaining = stop_run(plan.run_id, transports)
    nodes = [{**n, "state": "stopped"} if n.get("state") in ("running", "starting") else n
             for n in data.get("nodes", [])]
    record(RunPaths(run_dir), plan, None, "stopped", stopped_at=now(), remaining=remaining, nodes=nodes)
    return remaining


COLLECTIVES_MODULE = "fsdpctl.workload.collectives"
COLLECTIVES_PREFIX = "fsdpctl.collectives: "
# NCCL says which transport carries its channels ("via NET/IB/0", "via NET/Socket/1", "via P2P/IPC").
_NCCL_TRANSPORT = re.compile(r"via (NET/IB|NET/Socket|P2P|SHM|NVLS|CollNet)")
COLLECTIVES_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def collectives_result(lines: Sequence[str]) -> dict[str, Any] | None:
    """Rank 0's result line of the collective smoke test, with the transports NCCL reported."""
    result = None
    transports: set[str] = set()
    for line in lines:
        if (at := line.find(COLLECTIVES_PREFIX)) >= 0:
            try:
                result = json.loads(line[at + len(COLLECTIVES_PREFIX):])
            except ValueError:
                continue
        transports.update(_NCCL_TRANSPORT.findall(line))
    if result is not None:
        if result.get("backend") == "gloo":
            result["transport"] = ["gloo/TCP"]
        else:
            result["transport"] = sorted(transports) or ["unknown (no NCCL transport line seen)"]
    return result


def submit_slurm(paths: RunPaths, plan: LaunchPlan, scripts: dict[str, str], profile_text: str) -> str:
    """Write the run directory (shared by the nodes: the scripts, the workload package) and submit
    the job, through ``sbatch`` or submitit's executor; returns Slurm's job id, recorded in run.json."""
    import io
    import tarfile

    from . import slurm
    from .nodes import workload_bundle

    assert plan.slurm is not None
    prepare(paths, plan, scripts, profile_text)
    run_dir = Path(plan.run_dir).expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    (script_name, script), = scripts.items()
    with tarfile.open(fileobj=io.BytesIO(workload_bundle(script_name, script)), mode="r:gz") as tar:
        tar.extractall(run_dir, filter="data")
    if plan.slurm.via == "submitit":
        job_id = _submit_with_submitit(plan, run_dir, script)
        output = run_dir / "submitit" / f"{job_id}_0_log.out"
    else:
        job_id = slurm.submit_batch(str(run_dir / script_name), str(run_dir))
        output = run_dir / f"slurm-{job_id}.out"
    record(paths, plan, None, "submitted", submitted_at=now(), job_id=job_id, via=plan.slurm.via,
           slurm_output=str(output),
           nodes=[{"node_rank": r, "host": f"slurm node {r}", "state": "pending", "exit_code": None}
                  for r in range(plan.num_nodes)])
    return job_id


def submitit_job(plan: LaunchPlan, run_dir: Path, setup: str) -> tuple[str, str, dict[str, Any]]:
    """submitit's folder (unique to the run: job ids restart when a cluster is reset), the node
    Python command, and the executor parameters."""
    from . import slurm
    from .shell import quote_path

    assert plan.slurm is not None
    params = slurm.submitit_parameters(plan.slurm.directives, setup.splitlines(), plan.slurm.signal_seconds)
    return str(run_dir / "submitit"), quote_path(plan.python), params


def _submit_with_submitit(plan: LaunchPlan, run_dir: Path, setup: str) -> str:
    from . import slurm
    from .plan import SHIPPED_PACKAGE_DIR
    from .workload.slurm_task import NodeTask

    assert plan.slurm is not None
    slurm.ship_submitit(str(run_dir / SHIPPED_PACKAGE_DIR))
    folder, python, params = submitit_job(plan, run_dir, setup)
    # Leave submitit's task most of the warning time to wait for the workers' checkpoint.
    task = NodeTask(plan.slurm.step_command, str(run_dir), plan.slurm.requeue,
                    save_seconds=max(5.0, plan.slurm.signal_seconds - 10.0))
    return slurm.submit_with_submitit(folder, python, params, task)
