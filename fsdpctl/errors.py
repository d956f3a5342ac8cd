"""The error hierarchy: every failure a user can cause is an FsdpctlError with a hint.

The CLI turns these into one line on stderr (plus the hint) and an exit code; only
``FSDPCTL_DEBUG=1`` shows a traceback.
"""

from __future__ import annotations


class FsdpctlError(Exception):
    """A failure the user can act on. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(FsdpctlError):
    """Wrong flags or arguments on the command line."""

    exit_code = 2


def one_line(text: str) -> str:
    """Escape control characters so text quoted from a user's file cannot break the line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class ProfileError(UsageError):
    """A cluster profile that cannot be used: ``file:line: field: problem; fix``."""

    def __init__(self, source: str, line: int | None, field: str, problem: str, fix: str):
        source, field, problem, fix = (one_line(x) for x in (source, field, problem, fix))
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {field}: {problem}; {fix}")
        self.source = source
        self.line = line
        self.field = field
        self.problem = problem
        self.fix = fix


class ProfileNotFound(UsageError):
    """``--profile NAME`` matched no file in the search path."""


class HostError(FsdpctlError):
    """One host could not be used: ``cause`` is a short label (unreachable, refused, unresolved,
    auth, unknown-host-key, changed-host-key, timeout, ssh) and ``detail`` says what happened."""

    def __init__(self, host: str, cause: str, detail: str, hint: str):
        super().__init__(f"{host}: {detail}", hint)
        self.host = host
        self.cause = cause
        self.detail = detail


class PreflightError(FsdpctlError):
    """The checks before a start failed on some node: nothing was started. ``report`` is doctor's
    report of the nodes (``report.hosts``, ``report.parity``: which host, which check, the fix)."""

    def __init__(self, report, message: str = "preflight failed; nothing was started", hint: str | None = None):
        if hint is None:  # what failed where, so the last line says it too (the report may be long, or elsewhere)
            failing = getattr(report, "failing", lambda: "")()
            hint = (f"fix what the report names{f' ({failing})' if failing else ''}, "
                    "or skip the checks: --no-preflight, preflight=False")
        super().__init__(message, hint)
        self.report = report


class WaitTimeout(FsdpctlError, TimeoutError):
    """``Run.wait(timeout=...)`` ran out of time; the run goes on."""
