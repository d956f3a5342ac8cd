"""Probe every host of a profile in parallel, judge each one, and diff them against each other.

One connection and one remote command per host: the probe also holds the rendezvous port open on
the master while the other hosts' probes connect to it, so port reachability needs no extra round
when the probes start close together. Where some did not reach the master (their probes began
after its window had closed: 256 probes started over minutes on a loaded launcher), the port alone
is checked again in a round of its own once every probe has answered, all nodes at once; only what
fails that round too is a failure. A host that fails never stops the others; each failure carries
its precise cause and a hint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from ..container.judge import container_checks
from ..errors import HostError
from ..plan.make import container_plan
from ..profiles.schema import ClusterProfile
from .checks import (
    PORT_WINDOW_SECONDS,
    Check,
    DoctorReport,
    HostReport,
    judge_host,
    judge_parity,
    port_checks,
    port_window,
)
from .health import judge_health
from .port_probe import PORT_OVER, PORT_READY, port_round_request
from .probe import ProbeOutputError, container_probe_args, parse_probe_output, port_round_command, probe_command
from .probe_script import END
from .requirements import requirement_name


@dataclass(frozen=True)
class HostJob:
    """What to probe on one host: its transport, rank and the probe's arguments."""

    node_rank: int
    transport: Any
    args: dict[str, Any]
    requirements: tuple[str, ...] = ()
    """What the job needs installed (the probe is only asked for the names)."""
    nproc: Optional[int] = None
    """Its own process count, where nodes differ (None: the run's)."""
    gpus: tuple[int, ...] = ()
    """The GPUs its ranks use, by index (empty: every GPU)."""
    python: Optional[str] = None
    """The Python its probe runs with, where it is not the run's (an environment made there already)."""


def probe_args(profile: ClusterProfile, deep: bool, requirements: Sequence[str]) -> dict[str, Any]:
    """What every node's probe is asked, besides the port check (with a container: inside the image too)."""
    args = {"workdir": profile.workdir, "interface": profile.network.interface, "deep": deep,
            "packages": [requirement_name(r) for r in requirements]}
    container = container_plan(profile)
    if container is not None:
        args["container"] = container_probe_args(container, profile.python or "python3")
    return args


def host_python(profile: ClusterProfile, python: str) -> str:
    """The Python that runs the probe on the hosts: ``python``, or with a container the hosts' own."""
    return profile.container.host_python if profile.container else python


def health_args(full: bool, allow_busy: bool, gpus: bool = True) -> dict[str, Any]:
    """What the probe's hardware part is asked: the GPUs (the preflight; nothing when ``gpus`` is off
    and not ``full``), and with ``full`` (doctor --health) the kernel log's XIDs, DCGM and InfiniBand
    too; ``allow_busy`` is for the judge."""
    if not (gpus or full):
        return {}
    return {"health": {"xid": full, "dcgm": full, "ib": full, "allow_busy": allow_busy}}


@dataclass(frozen=True)
class NodeProbe:
    """A node to probe: its rank, its connection, and its own card's name when it differs from the profile's."""

    node_rank: int
    transport: Any
    interface: Optional[str] = None
    nproc: Optional[int] = None
    """Its own process count, where nodes differ (None: the run's)."""
    gpus: tuple[int, ...] = ()
    """The GPUs its ranks use, by index (empty: every GPU): only these are judged."""


def make_jobs(profile: ClusterProfile, nodes: Sequence[NodeProbe], master_rank: int, master_addr: str,
              port: int, deep: bool, port_check: bool, window: float = PORT_WINDOW_SECONDS,
              requirements: Sequence[str] = (), extra: Optional[dict[str, Any]] = None) -> list[HostJob]:
    """One probe per node; the master listens on the rendezvous port, the others connect to it.
    ``extra``: more the probes are asked (``init``'s discoveries)."""
    jobs = []
    others = len(nodes) - 1
    window = max(window, port_window(len(nodes)))
    for node in nodes:
        args = {**probe_args(profile, deep, requirements), **(extra or {})}
        if node.interface:
            args["interface"] = node.interface
        if port_check:
            if node.node_rank == master_rank:
                args["listen"] = {"port": port, "expect": others, "window": window}
            else:
                args["connect"] = {"addr": master_addr, "port": port, "window": window}
        jobs.append(HostJob(node.node_rank, node.transport, args, tuple(requirements), node.nproc, node.gpus))
    return jobs


ProbeRunner = Callable[[HostJob, float], tuple[int, str, str]]
"""Runs one host's probe within a timeout; returns (exit status, stdout, stderr)."""


def run_probe_command(job: HostJob, python: str, timeout: float) -> tuple[int, str, str]:
    """The probe as a command of its own (doctor)."""
    return job.transport.run(probe_command(job.python or python, job.args), timeout)


def probe_host(job: HostJob, python: str, timeout: float, profile: ClusterProfile,
               nproc: Optional[int], runner: ProbeRunner | None = None) -> HostReport:
    """Connect, probe and judge one host; never raises for a host-side problem. The connection stays
    open for the caller (launch reuses it); the caller closes it. ``runner`` runs the probe (default:
    a command of its own; launch's runs it inside the command that stages and starts the node)."""
    started = time.monotonic()
    report = HostReport(host=job.transport.host, node_rank=job.node_rank, interface=job.args.get("interface"))
    try:
        status, out, err = (runner(job, timeout) if runner else run_probe_command(job, python, timeout))
        if status == 127 or (status != 0 and "No such file" in err and python in err):
            report.checks = [Check("reachable", "pass", "connected"),
                             Check("python", "fail", f"{python} not found on this host",
                                   "set `python:` in the profile to an interpreter that exists there")]
        elif status != 0:
            last = (err.strip().splitlines() or ["(no output)"])[-1]
            report.checks = [Check("reachable", "pass", "connected"),
                             Check("probe", "fail", f"probe exited {status}: {last}",
                                   "run the profile's python by hand on this host to see why")]
        else:
            facts = parse_probe_output(out)
            facts["_received"] = time.time()
            report.facts = facts
            report.checks = [Check("reachable", "pass", "connected"),
                             *(container_checks(facts["container"], profile.network.ib) if "container" in facts
                               else ()),
                             *judge_host(profile, facts, job.nproc or nproc, job.requirements,
                                         job.args.get("interface"), job.gpus),
                             *judge_health(profile.device, facts, job.args.get("health"), job.gpus)]
    except HostError as exc:
        report.checks = [Check(_CAUSE_CHECK.get(exc.cause, "reachable"), "fail", exc.detail, exc.hint)]
    except ProbeOutputError as exc:
        report.checks = [Check("probe", "fail", str(exc), "the node's shell may print to stdout; check its rc files")]
    finally:
        report.seconds = time.monotonic() - started
    if report.facts is not None:
        report.facts.pop("_received", None)
    return report


# Which check a connection failure belongs to: the network, or the SSH trust/identity layer.
_CAUSE_CHECK = {"auth": "authenticated", "unknown-host-key": "authenticated", "changed-host-key": "authenticated",
                "timeout": "probe"}


def run_doctor(profile: ClusterProfile, jobs: Sequence[HostJob], *, python: str, timeout: float,
               nproc: Optional[int], concurrency: int = 1024,
               on_host: Callable[[HostReport], None] | None = None,
               runner: ProbeRunner | None = None, port_sessions: PortSessions | None = None) -> DoctorReport:
    """Probe every host (at most ``concurrency`` at once) and build the report. ``port_sessions``:
    where the port round asks the nodes (default: a command of its own on each)."""
    started = time.monotonic()
    reports: list[HostReport] = []
    held: list[HostReport] = []  # their port verdict may change in the port round: shown after it
    with ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs)))) as pool:
        futures = [pool.submit(probe_host, job, python, timeout, profile, nproc, runner) for job in jobs]
        for future in as_completed(futures):
            report = future.result()
            reports.append(report)
            if _unreached(report):
                held.append(report)
            elif on_host:
                on_host(report)
    reports.sort(key=lambda r: r.node_rank)
    recheck_ports(jobs, reports, port_sessions or CommandSessions(python))
    for report in held:
        if on_host:
            on_host(report)
    return DoctorReport(profile=profile.name, hosts=reports, parity=judge_parity(profile, reports),
                        seconds=time.monotonic() - started)


PORT_ROUND_SLACK_SECONDS = 30.0
"""What a node's part of the port round may take beyond its window (doctor's starts a Python on each
node over its open connection, on a node that may still be loaded)."""
AGAIN = " (checked again once every probe had answered)"


class RoundSession(Protocol):
    """What the port round needs of a node's session (a transport's ``Session``)."""

    def send(self, data: bytes) -> None: ...

    def read_until(self, marker: str, timeout: float) -> str: ...

    def close(self) -> None: ...


class PortSessions(Protocol):
    """Where a node's part of the port round is asked: a session that reads ``port_round_request``
    lines and answers between the probe's sentinels."""

    def open(self, job: HostJob) -> RoundSession:
        """The node's session for the round. Raises HostError."""

    def done(self, job: HostJob, session: RoundSession) -> None:
        """The node's part is over."""


class CommandSessions:
    """doctor's: a command of its own on each node (``probe.port_round_command``)."""

    def __init__(self, python: str):
        self.python = python

    def open(self, job: HostJob) -> RoundSession:
        return job.transport.session(port_round_command(self.python))

    def done(self, job: HostJob, session: RoundSession) -> None:
        session.close()


def _unreached(report: Optional[HostReport]) -> bool:
    connect = (report.facts or {}).get("connect") if report is not None else None
    return bool(connect) and not connect.get("reached")


def recheck_ports(jobs: Sequence[HostJob], reports: Sequence[HostReport], sessions: PortSessions) -> None:
    """Check the rendezvous port again, alone, for the nodes whose probe did not reach the master,
    when the master's probe found its port free: their probes may simply have started after the
    master's window closed. The master listens first; once it says so, those nodes connect, all
    at once, within the window; then the master is told the round is over. Their reports (and the
    master's) take the round's verdicts; a node that cannot reach it then either stays failed, said so."""
    master_job = next((job for job in jobs if job.args.get("listen")), None)
    by_rank = {report.node_rank: report for report in reports}
    master = by_rank.get(master_job.node_rank) if master_job is not None else None
    if master is None or not ((master.facts or {}).get("listen") or {}).get("free"):
        return  # no port check, or the master's own probe failed or found its port taken: that verdict stands
    failed = [job for job in jobs if _unreached(by_rank.get(job.node_rank))]
    if not failed:
        return
    window = port_window(len(failed) + 1)
    listening = {"listen": {**master_job.args["listen"], "expect": len(failed), "window": 0}}
    answers: dict[int, dict[str, Any] | str] = {}
    try:
        session = sessions.open(master_job)
        try:
            session.send(port_round_request(listening).encode())
            said = session.read_until(PORT_READY, PORT_ROUND_SLACK_SECONDS)
            if f"{PORT_READY} listening" in said:
                with ThreadPoolExecutor(max_workers=len(failed)) as pool:
                    answers.update(zip((job.node_rank for job in failed), pool.map(
                        lambda job: _port_round(job, sessions, window), failed), strict=True))
                session.send(f"{PORT_OVER}\n".encode())
            said += session.read_until(END, PORT_ROUND_SLACK_SECONDS)
        finally:
            sessions.done(master_job, session)
        answers[master_job.node_rank] = _answer(said)
    except HostError as exc:
        answers[master_job.node_rank] = exc.detail
    for rank, answer in answers.items():
        report = by_rank[rank]
        if isinstance(answer, str):  # the round could not run there: the probe's own verdict stands
            report.checks = [*report.checks, Check("port", "warn", f"the port round could not run: {answer}")]
            continue
        facts = report.facts or {}
        if "listen" in answer:
            answer["listen"]["peers"] = [*facts["listen"].get("peers", []), *answer["listen"].get("peers", [])]
        facts.update(answer)
        report.checks = [check for check in report.checks if check.name != "port"] + port_checks(answer, AGAIN)
    for job in failed:
        if job.node_rank not in answers:  # the master never listened: said on the master's line
            report = by_rank[job.node_rank]
            report.checks = [*report.checks, Check("port", "warn", "the port round could not run: the master's "
                                                                   "part of it did not listen")]


def _port_round(job: HostJob, sessions: PortSessions, window: float) -> dict[str, Any] | str:
    """One node's part of the port round (it connects): its answer, or why there is none."""
    try:
        session = sessions.open(job)
        try:
            session.send(port_round_request({"connect": {**job.args["connect"], "window": window}}).encode())
            return _answer(session.read_until(END, window + PORT_ROUND_SLACK_SECONDS))
        finally:
            sessions.done(job, session)
    except HostError as exc:
        return exc.detail


def _answer(out: str) -> dict[str, Any] | str:
    try:
        return parse_probe_output(out)
    except ProbeOutputError as exc:
        return str(exc)
