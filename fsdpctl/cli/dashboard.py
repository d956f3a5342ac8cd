"""``fsdpctl dashboard``: every run on one local web page, live (``fsdpctl.web``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def dashboard(
    port: Optional[int] = typer.Option(None, "--port", help="Port to listen on (default: 8787, or the next free one)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Anything but loopback lets other "
                             "machines reach it (the token still guards it): prefer the printed ssh -L line."),
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help="The runs directory (default: "
                                            "$FSDPCTL_RUNS_DIR, else ./runs)."),
    new_token: bool = typer.Option(False, "--new-token", help="Make a new token (pages opened with the old one "
                                   "must be opened again with the new URL)."),
) -> None:
    """Every run on one local web page, live: the runs, each run's progress, losses, tokens/s, every
    rank's compute by window, each node's GPUs on the same time axis, attempts, logs and plan, with
    stop and stacks buttons; a profile's hosts. Prints the URL (with its token) and Ctrl-C ends it."""
    from ..hostpool.store import state_dir
    from ..rundir.paths import runs_root
    from ..web.serve import start_dashboard
    from .events import say

    started = start_dashboard((runs_dir or runs_root()).resolve(), state_dir(), host, port, new_token)
    if started.exposed:
        say(f"warning: listening on {host}, which other machines may reach; anyone with the token can stop runs",
            "yellow")
    say(f"dashboard of {runs_dir or runs_root()}; open (the token is yours alone):")
    typer.echo(started.url)
    if started.tunnel:
        say(f"from your laptop: {started.tunnel}  (then open the same URL there)")
    try:
        started.server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        say("dashboard stopped")
    finally:
        started.server.server_close()
