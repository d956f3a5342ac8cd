"""``fsdpctl logs``: a run's output, merged and prefixed, filtered by node, rank or pattern; ``-f`` follows."""

from __future__ import annotations

import re
from typing import Optional

import typer

from ..errors import UsageError
from .complete import hosts as host_completion
from .complete import rank_completion, run_completion


def logs(
    run_id: Optional[str] = typer.Argument(None, help="Run id (or a unique prefix); default: the latest run.",
                                          autocompletion=run_completion),
    follow: bool = typer.Option(False, "-f", "--follow", help="Follow a running job until it ends."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Only lines of this global rank.",
                                       autocompletion=rank_completion),
    host: Optional[str] = typer.Option(None, "--host", help="Only lines of this host (as in the profile).",
                                       autocompletion=host_completion),
    grep: Optional[str] = typer.Option(None, "--grep", help="Only lines matching this regular expression."),
    attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="An earlier attempt's logs (`fsdpctl "
                                          "status` lists them); default: the newest."),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="Show a line several ranks print alike once, "
                               "with the ranks that said it ([r0-7], [all 16 ranks]); the nodes' files keep every "
                               "line, and --no-dedup shows them as they are."),
) -> None:
    """Print a run's logs, merged across nodes, each line prefixed with [host rRANK]; a line several ranks
    printed alike is shown once, with the ranks that said it."""
    import fsdpctl

    from .events import EventPrinter, exit_code_of, folder_if, say

    try:
        pattern = re.compile(grep) if grep else None
    except re.error as exc:
        raise UsageError(f"--grep {grep!r}: not a regular expression ({exc})", "escape special characters") from None

    def wanted(line: fsdpctl.LogLine) -> bool:
        return ((host is None or line.host == host) and (rank is None or line.rank == rank)
                and (pattern is None or pattern.search(line.text) is not None))

    with fsdpctl.get_run(run_id) as run:
        world = run.plan.world_size
        printer = EventPrinter(quiet_progress=True, show_line=wanted, folder=folder_if(dedup, world))
        if follow:
            if attempt is not None and attempt != run.attempt:
                run.logs(follow=True, attempt=attempt)  # refuses it, in one line
            state = run.info.state
            if not state.is_over:
                run.wait(on_event=printer, handle_signals=True)
                raise typer.Exit(exit_code_of(printer))
            say(f"run {run.run_id} is {state}; showing its logs")
        reader = run.logs(attempt=attempt)
        printer.folder = folder_if(dedup, world, by_lines=True)  # read back: lines, not seconds, apart
        for line in reader:
            printer.line(line)
        printer.finish()
        for note in reader.notes:
            typer.echo(note, err=True)
