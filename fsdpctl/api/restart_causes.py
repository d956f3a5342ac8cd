"""Why a failed attempt is, or is not, started again: its failure's cause, judged against the
profile's ``restart`` section (``fsdpctl.profiles.restart_spec``) and the attempts before it.

A restart fixes what is outside the program: a lost node, a hang, a broken transport, faulty
hardware, a process killed from outside. It cannot fix the program's own error when the attempt
before it failed the same way at the same step: that one ends the run, saying so, instead of
spending every restart left on it.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ..profiles.restart_spec import RestartSpec
    from ..rundir.rundir import RunDir
    from ..rundir.state import Failure
    from ..rundir.status import AttemptInfo

TRANSPORT = re.compile(
    r"NCCL (?:error|WARN)|ncclRemoteError|ncclSystemError|ncclInternalError|DistNetworkError|DistBackendError"
    r"|ProcessGroupNCCL.*(?:timed out|Timeout|abort)|Connection (?:reset|closed|refused) by peer|Broken pipe"
    r"|\[enforce fail at .*gloo|gloo.*(?:Connection|timed out|Timed out|closed)|Socket Timeout|ECONNRESET",
    re.IGNORECASE)
"""What a NCCL or gloo transport failure prints (torch's c10d, gloo's enforce lines, NCCL's own)."""

RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:")
"""torchrun's prefix of a rank's line (``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``)."""

OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
"""Signals that come from outside the program: the OOM killer, a preemption, a person."""

WHAT = {"lost": "a lost node", "hang": "a hang", "transport": "a transport error", "hardware": "a hardware fault",
        "signal": "a rank killed from outside", "program": "a program error", "exit_code": "an exit code to restart on",
        "resize": "a planned change of the node count"}


@dataclass(frozen=True)
class Verdict:
    """Whether a failed attempt is started again, and why; run.json keeps it as the attempt's ``restart``."""

    cause: str
    """``lost``, ``hang``, ``transport``, ``hardware``, ``signal``, ``program``, ``exit_code`` or ``resize``."""
    restart: bool
    why: str
    """One line: "a lost node (n2 (node 1) was lost)", "not restarted: ...". """
    signature: Optional[str] = None
    """A program error's exit and last error line, to know it again in the next attempt."""
    step: Optional[int] = None
    """The newest training step the attempt reached, where the rows say."""

    def to_json(self) -> dict[str, Any]:
        data = {"cause": self.cause, "restarted": self.restart, "why": self.why, "signature": self.signature,
                "step": self.step}
        return {k: v for k, v in data.items() if v is not None}


def cause_of(failure: Failure, spec: RestartSpec, hardware: Mapping[str, str]) -> str:
    """The cause of ``failure`` (``hardware``: host -> fault, as the nodes' GPU watchers said it)."""
    if failure.kind in ("lost", "hang", "resize"):
        return failure.kind
    if failure.host in hardware or (hardware and failure.peer_gone):
        return "hardware"
    if failure.signal is None and failure.exit_code in spec.exit_codes:
        return "exit_code"
    text = "\n".join((*failure.last_lines, failure.error or ""))
    if failure.peer_gone or TRANSPORT.search(text):
        return "transport"
    if failure.signal in OUTSIDE_SIGNALS and not failure.in_shutdown:
        return "signal"
    return "program"


def signature_of(failure: Failure) -> str:
    """A program error as it would be seen again: its exit and its error's last line (else its last line)."""
    said = failure.error or next((line for line in reversed(failure.last_lines) if line.strip()), "")
    return f"exit {failure.exit_code}: {RANK_PREFIX.sub('', said.strip())}"


def judge(failure: Optional[Failure], spec: RestartSpec, *, hardware: Mapping[str, str], step: Optional[int],
          before: Optional[Mapping[str, Any]], restarted_at: list[datetime], now: datetime) -> Verdict:
    """Whether the attempt that ended with ``failure`` is restarted (the budget of ``max_restarts`` is the
    caller's). ``before``: the attempt before it's own verdict (run.json's ``restart``); ``restarted_at``:
    when each earlier restart began, for ``spec.per_hour``."""
    if failure is None:
        return Verdict("program", "program" in spec.causes, "the run failed and names no failure")
    cause = cause_of(failure, spec, hardware)
    said = f"{WHAT[cause]} ({failure.describe()})"
    if cause == "resize":
        return Verdict(cause, True, said)
    signature = signature_of(failure) if cause in ("program", "exit_code") else None
    if cause != "exit_code" and cause not in spec.causes:
        return Verdict(cause, False, f"not restarted: {said}, and restart.causes is {', '.join(spec.causes)}",
                       signature, step)
    if cause == "program" and before and before.get("signature") == signature and before.get("step") == step:
        where = f" at step {step}" if step is not None else ""
        return Verdict(cause, False, f"not restarted: {said} repeats the attempt before it{where}; a restart would "
                                     f"fail the same way", signature, step)
    if spec.per_hour is not None:
        recent = [when for when in restarted_at if now - when < timedelta(hours=1)]
        if len(recent) >= spec.per_hour:
            return Verdict(cause, False, f"not restarted: {said}; {len(recent)} restart(s) in the last hour "
                                         f"(restart.per_hour {spec.per_hour})", signature, step)
    return Verdict(cause, True, said, signature, step)


def judge_run(run: RunDir, failure: Optional[Failure], hardware: Mapping[str, str]) -> Verdict:
    """``judge`` for the run's attempt that just failed: its profile's ``restart``, its newest step,
    the attempt before it and when its earlier restarts began."""
    from ..live.newest import newest_step
    from ..rundir.record import now

    record = run.record
    earlier: tuple[AttemptInfo, ...] = record.attempts
    restarted_at = [_parse(a.finished_at) for a in earlier if (a.restart or {}).get("restarted")]
    return judge(failure, run.profile.restart, hardware=hardware, step=newest_step(run),
                 before=earlier[-1].restart if earlier else None,
                 restarted_at=[when for when in restarted_at if when is not None], now=_parse(now()) or datetime.now())


def hardware_faults(run: RunDir) -> dict[str, str]:
    """The hardware faults each node's GPU watcher said in the attempt's log (host -> what), from
    the node logs kept here."""
    from ..node.gpu_watch import fault_in_log

    faults = {}
    for node in run.record.nodes:
        try:
            text = (run.paths.logs / f"node{node.node_rank}.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if (fault := fault_in_log(text)) is not None:
            faults[node.host] = fault
    return faults


def _parse(stamp: Optional[str]) -> Optional[datetime]:
    try:
        return datetime.fromisoformat(stamp).replace(tzinfo=None) if stamp else None
    except ValueError:
        return None
