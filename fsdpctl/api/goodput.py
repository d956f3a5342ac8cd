"""Many runs' goodput (``fsdpctl.accounting``, ``report --goodput``): the runs of a period or a profile,
each run's account (``Run.goodput``) and their totals."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Optional, Union

from ..accounting.across import RunAccount, lines, to_json
from ..errors import FsdpctlError, UsageError
from .options import PathLike
from .run import Run

_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass
class GoodputReport:
    """The accounts of the runs asked for (``runs``), the runs that have none yet (``skipped``), and
    what was asked (``heading``)."""

    runs: list[RunAccount]
    heading: str
    skipped: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        """What ``report --goodput`` prints."""
        return "\n".join(lines(self.runs, self.heading, self.skipped))

    def to_json(self) -> dict[str, Any]:
        """What ``report --goodput --json`` prints."""
        return to_json(self.runs, self.heading, self.skipped)


def since_moment(since: Union[str, datetime, None], now: Optional[datetime] = None) -> Optional[datetime]:
    """``7d``, ``12h``, ``30m``, ``2w`` ago, or a date or time (ISO 8601) as a moment; None for None."""
    if since is None:
        return None
    if isinstance(since, datetime):
        return since.astimezone()
    now = now or datetime.now().astimezone()
    text = since.strip()
    ago = _AGO.match(text)
    if ago:
        return now - timedelta(**{_UNITS[ago.group(2)]: float(ago.group(1))})
    try:
        return datetime.fromisoformat(text).astimezone()
    except ValueError:
        raise UsageError(f"--since {since!r}: not a time", "give an age (30m, 12h, 7d, 2w) or a date "
                         "(2026-11-21, 2026-11-21T08:00)") from None


def goodput(runs: Optional[list[Union[str, Run]]] = None, *, since: Union[str, datetime, None] = None,
            profile: Optional[str] = None, fetch: bool = False, runs_dir: Optional[PathLike] = None) -> GoodputReport:
    """The goodput of many runs: those given, else every run in ``runs_dir`` created since ``since``
    (an age such as ``7d`` or a date) and on ``profile`` (its name), each from the files here unless
    ``fetch``. A run without an account yet (no attempt timed) is listed in ``skipped``."""
    from .registry import get_run
    from .registry import runs as every_run

    moment = since_moment(since)
    chosen = [r if isinstance(r, Run) else get_run(r, runs_dir=runs_dir) for r in runs] if runs else \
        every_run(runs_dir=runs_dir)
    counted, skipped = [], []
    for run in chosen:
        record = run._dir.record
        created = _created(run.info.created_at)
        if (profile is not None and record.profile != profile) or (moment is not None and created is not None
                                                                    and created < moment):
            continue
        try:
            account = run.goodput(fetch=fetch)
        except (FsdpctlError, OSError, ValueError):
            account = None
        if account is None:
            skipped.append(run.run_id)
        else:
            counted.append(RunAccount(run.run_id, record.profile, run.info.created_at, account))
    parts = [f"on profile {profile}" if profile else "", f"since {moment:%Y-%m-%d %H:%M}" if moment else ""]
    heading = " ".join(p for p in parts if p) or ("given" if runs else "in the runs folder")
    return GoodputReport(counted, heading, skipped)


def _created(text: Optional[str]) -> Optional[datetime]:
    try:
        return datetime.fromisoformat(text).astimezone() if text else None
    except ValueError:
        return None
