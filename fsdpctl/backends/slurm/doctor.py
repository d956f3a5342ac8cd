"""``fsdpctl doctor`` for a Slurm profile: the controller, the partition, then the same probe as
over SSH on nodes allocated through ``srun`` (one task per node), with the rendezvous port tried
between them and a check that they see the submitting machine's workdir.

The probe runs inside a real allocation, so it sees what a job will see: the nodes Slurm picks,
their environment after the profile's setup lines, their network between each other.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from ...hostcheck.checks import PORT_WINDOW_SECONDS, Check, DoctorReport, HostReport, judge_host, judge_parity
from ...hostcheck.fanout import probe_args
from ...hostcheck.health import judge_health
from ...hostcheck.probe import ProbeOutputError, parse_probe_output, probe_source
from ...hostcheck.probe_script import BEGIN, END
from ...profiles.schema import ClusterProfile, slurm_directive_name
from ...shell import quote_path
from ..base import DoctorRequest
from . import client as slurm
from .scripts import render_slurm_head
from .tasks import split_tasks

_HEAD_PLACEHOLDER = "FSDPCTL_HEAD_ADDRESS"
# The profile's extra directives that shape which nodes a job gets; doctor's srun passes them on
# (the others, like --mail-type, mean nothing to a probe or are sbatch-only).
_ALLOCATION_OPTIONS = ("reservation", "gres", "mem", "mem-per-cpu", "mem-per-gpu", "exclusive", "nodelist",
                       "exclude", "cpus-per-gpu", "gpus", "gres-flags", "clusters", "licenses")


def controller_check() -> Check:
    """Does slurmctld answer?"""
    done = slurm.run_client(["scontrol", "ping"])
    text = " ".join(done.stdout.split())
    if done.returncode == 0 and "UP" in text:
        return Check("controller", "pass", text)
    return Check("controller", "fail", text or slurm.last_line(done.stderr, "no answer"),
                 "start slurmctld, or point SLURM_CONF at this cluster's slurm.conf")


def partition_check(partition: Optional[str], nodes: int) -> Check:
    """The partition exists, is up, has enough nodes, and (warn) enough of them idle now."""
    argv = ["sinfo", "-h", "-o", "%P|%a|%D|%T"] + (["-p", partition] if partition else [])
    done = slurm.run_client(argv)
    rows = [line.split("|") for line in done.stdout.split("\n") if line.count("|") == 3]
    if partition is None:
        rows = [r for r in rows if r[0].endswith("*")]  # the default partition is starred
    if done.returncode != 0 or not rows:
        known = [p.rstrip("*") for p in slurm.run_client(["sinfo", "-h", "-o", "%P"]).stdout.split()]
        name = partition or "(default)"
        return Check("partition", "fail", f"partition {name} does not exist (has: {', '.join(known) or 'none'})",
                     "set slurm.partition (or --partition) to one sinfo lists")
    name, avail = rows[0][0].rstrip("*"), rows[0][1]
    total = sum(int(r[2]) for r in rows)
    idle = sum(int(r[2]) for r in rows if r[3] == "idle")
    detail = f"{name}: {avail}, {total} node(s), {idle} idle, {nodes} needed"
    if avail != "up":
        return Check("partition", "fail", detail, f"the partition is {avail}; ask the admins or pick another")
    if total < nodes:
        return Check("partition", "fail", detail, "ask for fewer nodes (slurm.nodes / --nodes) or another partition")
    if idle < nodes:
        return Check("partition", "warn", detail, "the job will wait in the queue until nodes free up")
    return Check("partition", "pass", detail)


def node_probe_script(profile: ClusterProfile, python: str, nodes: int, request: DoctorRequest,
                      shared_file: str) -> str:
    """The shell each srun task runs: the profile's setup, then the probe; node 0 listens on the
    rendezvous port and the others connect to it at the head node's Slurm address."""
    port = request.port
    # What every node is asked, written once (it may hold the probe's own source, for the image or init),
    # then each node's part: node 0 listens, the others connect.
    base = json.dumps({**probe_args(profile, request.deep, request.requirements), "shared_file": shared_file,
                       **request.extra})
    listen = json.dumps({"listen": {"port": port, "expect": nodes - 1, "window": PORT_WINDOW_SECONDS}}
                        if request.port_check else {})
    # The head's address is only known on the node: bash puts it in place of the placeholder.
    connect = json.dumps({"connect": {"addr": _HEAD_PLACEHOLDER, "port": port, "window": PORT_WINDOW_SECONDS}}
                         if request.port_check else {})
    probe = f"{quote_path(python)} -c {shlex.quote(probe_source())}"
    lines = [*profile.setup, render_slurm_head().rstrip("\n"),
             f'if [ "$SLURM_NODEID" = 0 ]; then args={shlex.quote(listen)}; else args={shlex.quote(connect)}; fi; '
             f'args="${{args//{_HEAD_PLACEHOLDER}/$FSDPCTL_HEAD_ADDR}}"; base={shlex.quote(base)}; '
             f'base="${{base//{_HEAD_PLACEHOLDER}/$FSDPCTL_HEAD_ADDR}}"',
             f'exec {probe} "$base" "$args"']
    return "\n".join(lines)


def srun_argv(profile: ClusterProfile, nodes: int, partition: Optional[str], wait_seconds: int,
              script: str) -> list[str]:
    """One task per node, labelled output, given up when the nodes are not free within ``wait_seconds``;
    its time limit (minutes) is 5, or longer when the probe may take longer (a container's pull)."""
    spec = profile.slurm
    assert spec is not None
    minutes = max(5, -(-wait_seconds // 60) + 1)
    argv = ["srun", "--job-name=fsdpctl-doctor", f"--nodes={nodes}", "--ntasks-per-node=1", "--label",
            f"--immediate={wait_seconds}", f"--time={minutes}", "--kill-on-bad-exit=0"]
    for flag, value in (("partition", partition), ("account", spec.account), ("qos", spec.qos),
                        ("constraint", spec.constraint), ("gpus-per-node", spec.gpus_per_node)):
        if value is not None:
            argv.append(f"--{flag}={value}")
    argv += [d for d in spec.directives if slurm_directive_name(d) in _ALLOCATION_OPTIONS]
    return [*argv, "bash", "-c", script]


def storage_check(facts: dict, workdir: str) -> Check:
    if facts.get("shared_file"):
        return Check("storage", "pass", f"sees this machine's {workdir}")
    return Check("storage", "warn", f"does not see the file this machine wrote in {workdir}",
                 "put workdir on storage every node shares (NFS, Lustre...): the batch script, the workload, "
                 "logs and checkpoints live in the run directory")


def run_slurm_doctor(profile: ClusterProfile, request: DoctorRequest, *, python: str, nodes: Optional[int] = None,
                     partition: Optional[str] = None,
                     on_host: Callable[[HostReport], None] | None = None) -> DoctorReport:
    """The cluster checks, then the probe on ``nodes`` allocated nodes, judged and diffed as over SSH."""
    assert profile.slurm is not None
    started = time.monotonic()
    nodes = nodes or profile.slurm.nodes + profile.slurm.spares  # a job holds its spares too: probe them
    partition = partition or profile.slurm.partition
    cluster = [controller_check()]
    reports: list[HostReport] = []
    if cluster[0].status == "pass":
        cluster.append(partition_check(partition, nodes))
    if cluster[-1].status != "fail":
        reports = _probe_allocation(profile, request, python, nodes, partition, cluster, on_host)
    return DoctorReport(profile=profile.name, hosts=reports, parity=judge_parity(profile, reports),
                        seconds=time.monotonic() - started, cluster=cluster)


def _probe_allocation(profile: ClusterProfile, request: DoctorRequest, python: str, nodes: int,
                      partition: Optional[str], cluster: list[Check],
                      on_host: Callable[[HostReport], None] | None) -> list[HostReport]:
    timeout = request.timeout
    workdir = Path(profile.workdir).expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    token = workdir / f".fsdpctl-doctor-{secrets.token_hex(4)}"
    token.write_text("fsdpctl doctor: is this file visible on the nodes?\n", encoding="utf-8")
    started = time.monotonic()
    try:
        script = node_probe_script(profile, python, nodes, request, str(token))
        done = slurm.run_client(srun_argv(profile, nodes, partition, int(timeout), script), timeout=timeout + 60)
    finally:
        token.unlink(missing_ok=True)
    tasks = split_tasks(done.stdout, BEGIN, END)
    if not tasks:
        last = slurm.last_line(done.stderr, f"srun exited {done.returncode}")
        cluster.append(Check("allocation", "fail", f"srun on {nodes} node(s): {last}",
                             "check squeue for what holds the nodes, or the partition's limits"))
        return []
    cluster.append(Check("allocation", "pass", f"srun on {nodes} node(s) answered in "
                                               f"{time.monotonic() - started:.1f} s"))
    reports = []
    for task in range(nodes):
        report = HostReport(host=f"task {task}", node_rank=task, seconds=time.monotonic() - started)
        try:
            facts = parse_probe_output(tasks.get(task, ""))
        except ProbeOutputError as exc:
            report.checks = [Check("probe", "fail", f"{exc}: {tasks.get(task, '(no output)')[-200:]}",
                                   "run the profile's python on that node to see why")]
        else:
            facts["_received"] = time.time()
            report.host = facts.get("hostname") or report.host
            report.checks = [Check("reachable", "pass", "srun task ran"),
                             *judge_host(profile, facts, request.nproc, request.requirements),
                             *judge_health(profile.device, facts, request.extra.get("health")),
                             storage_check(facts, str(workdir))]
            facts.pop("_received", None)
            report.facts = facts
        reports.append(report)
        if on_host:
            on_host(report)
    return reports
