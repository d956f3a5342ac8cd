"""A profile's ``notify`` section: the notices a run sends to people (through apprise, or a command of
yours) when it starts, fails, restarts, finishes, or needs a look."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

NotifyEvent = Literal["started", "first_step", "failed", "restarted", "shrunk", "grown", "straggler", "hang",
                      "finished"]
NOTIFY_EVENTS: tuple[str, ...] = get_args(NotifyEvent)
NEEDS_A_PERSON: tuple[NotifyEvent, ...] = ("failed", "restarted", "shrunk", "grown", "straggler", "hang", "finished")


@dataclass(frozen=True, kw_only=True)
class NotifySpec:
    """Notices of a run's events, sent by the process that follows it (the launcher, or a detached
    run's follower) from a thread of their own: a slow or dead target never slows or fails the run.
    A send that fails is tried 3 times (1 s, then 2 s apart), then noted once in run.json's
    ``notes``. ``fsdpctl notify --test -p PROFILE`` sends one to every target and says what came back."""

    urls: tuple[str, ...] = ()
    """apprise URLs that hold no secret (``json://receiver:8080/hook``, ``ntfy://ntfy.sh/my-topic``,
    ``mailto://...``: Slack, Teams, Discord and a hundred more, see apprise's wiki). They are written
    into the run's profile copy: a URL with a token in it goes in ``secrets``."""
    secrets: tuple[str, ...] = ()
    """Names of variables of the environment fsdpctl runs in whose values are apprise URLs with a token
    (``SLACK_HOOK=slack://T000/B000/XXXX``): read at launch, handed to a detached run's follower in its
    environment, and written in no file."""
    command: tuple[str, ...] = ()
    """A program run once per notice (``[notify-send, fsdpctl]``, ``[/opt/bin/page-oncall]``), never
    through a shell: the notice as JSON on its stdin (``event``, ``run_id``, ``title``, ``body``, and
    the event's own fields), ``FSDPCTL_NOTIFY_EVENT`` and ``FSDPCTL_RUN_ID`` in its environment. A
    non-zero exit counts as a failed send."""
    events: tuple[NotifyEvent, ...] = NEEDS_A_PERSON
    """Which events are sent: ``started``, ``first_step`` (an attempt's first training step),
    ``failed`` (an attempt, with its first failure), ``restarted``, ``shrunk`` and ``grown`` (the next
    attempt on the same, fewer or more nodes), ``straggler`` (the bundled workload names a slow rank),
    ``hang`` (the hang watchdog saw no progress), ``finished`` (the run ended otherwise: succeeded or
    stopped, with its figures). Default: all but ``started`` and ``first_step``."""
    timeout: int = 10
    """Seconds one try of one send may take (apprise's connect and read timeouts; the command is killed)."""
