"""A run's metrics and their summary, and a report of several runs: what ``fsdpctl report`` and
``Run.report`` show. Runs come in as ``Run`` handles (their ``fetch``, ``path``, ``plan``, ``info``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..diagnose.trace_summary import kept_profiles
from ..errors import FsdpctlError, UsageError
from ..metrics.gpu_samples import GpuFold, read_files
from ..metrics.rows import Series, read_run_files, read_workload_summary
from ..metrics.summary import Report, RunSummary, summarize, summary_of
from .options import PathLike


def run_series(run: Any, fetch: bool = True, rows: bool = False) -> tuple[Series, RunSummary]:
    """A run's metrics and their summary: from its chart index (``fsdpctl.live.chart_index``) and
    what its files gained since, where the index is usable, else read from the files (``rows``:
    read them anyway, for figures drawn from every row; the series is otherwise empty)."""
    store = None if rows else _indexed(run)
    if store is not None:
        found, notes = run_files(run, fetch=False)
        series = Series(run.run_id, summary=read_workload_summary(next(iter(found["summary.json"]), None)))
        summary_ = summary_of(store.fold, run.run_id, attempts=int(run.info.attempt or 1), state=str(run.info.state),
                              skipped=store.feed.skipped, workload_summary=series.summary)
        gpus = store.gpu_fold
    else:
        found, notes = run_files(run, fetch)
        sources = metrics_sources(found)
        if not sources:
            raise UsageError(f"report {run.run_id}: no metrics from its nodes{'; ' + notes[0] if notes else ''}",
                             "the bundled workload writes them, and so does fsdpctl's telemetry in every rank of a "
                             "program of yours that steps a torch optimizer (unless launched with --no-telemetry); "
                             "a program may also append JSON lines with a \"step\" to $FSDPCTL_RUN_DIR/metrics.jsonl "
                             "(docs/guides/watching.md)")
        series = read_run_files(sources, run.run_id, next(iter(found["summary.json"]), None))
        summary_ = summarize(series, attempts=int(run.info.attempt or 1), state=str(run.info.state))
        gpus = GpuFold.of(read_files(_in_folders(found["gpu"])))
    summary_.notes = [*run.info.recoveries, *notes]
    timed = run.timeline()
    if timed:
        from ..rundir.timeline import render

        summary_.timeline = render(timed, {str(n.node_rank): n.host for n in run.plan.nodes})
    summary_.gpus = gpus.lines()
    summary_.profiles = kept_profiles(run.path)
    _add_goodput(run, summary_)
    if summary_.straggler and gpus.hosts:
        cause = gpus.cause(str(summary_.straggler.get("host")), summary_.straggler.get("local_ranks") or [])
        if cause:
            summary_.straggler["cause"] = cause
    return series, summary_


def _add_goodput(run: Any, summary_: RunSummary) -> None:
    """The run's goodput account into its summary, from the files brought back above."""
    from ..accounting.render import section

    try:
        counted = goodput_of(run, fetch=False)
    except Exception as exc:  # noqa: BLE001 - the report's other figures stand without it
        summary_.notes.append(f"goodput: not counted ({type(exc).__name__}: {exc})")
        return
    if counted is not None:
        summary_.goodput, summary_.goodput_lines = counted.to_json(), section(counted)


def _indexed(run: Any) -> Optional[Any]:
    """The run's charts from its chart index and what its files gained since (a ``ChartStore``), when
    the index is usable and its files are whole here: the collector's copies of a run that ended, or
    the run's own files on this machine. None: read the files."""
    from ..live import layout
    from ..live.charts import ChartStore

    if layout.readable_here(run.plan, run.path) is None and _collected(run) is None:
        return None
    store = ChartStore(run.path, run.plan, run.plan.world_size)
    if not store.index_path.is_file():
        return None
    store.update()
    if not store.index_loaded or store.sampled or not store.feed.rows:
        return None
    if store.feed.ranks_seen and len(store.metric_tails) > 1:
        return None  # a program's own per-rank rows from several nodes: merged by step, whole, from the files
    return store


def run_files(run: Any, fetch: bool = True) -> tuple[dict[str, list[Path]], list[str]]:
    """A run's ``metrics.jsonl``, ``summary.json`` and GPU sample files here, and what could not be
    had: the copies its collector kept when they are whole (its follower saw the end), else brought
    back from its nodes first when ``fetch``."""
    collected = _collected(run)
    if collected is not None:
        return collected, []
    notes: list[str] = []
    found: dict[str, list[Path]] = {}
    for name in _FILES if fetch else ():
        try:
            fetched = run.fetch(name)
        except (FsdpctlError, OSError) as exc:  # nodes gone: what was fetched before still reports
            notes.append(f"{name} not fetched again ({exc}); reporting what was fetched before")
            continue
        # (a folder comes back as the files in it: gpu/node<R>.jsonl)
        found[name] = sorted({Path(f) if Path(f).name == name else Path(f).parent for files in fetched.values()
                              for f in files if name in Path(f).parts})
    for name in _FILES:
        # Not fetched now: what an earlier fetch brought, or the run directory itself where it is on
        # this machine (a local run's, a shared Slurm directory): where fetch names them.
        found[name] = found.get(name) or _already_here(run, name)
    return found, notes


_FILES = ("metrics.jsonl", "summary.json", "gpu", "telemetry")


def _in_folders(paths: list[Path]) -> list[Path]:
    """Files as given, and the node files of folders (``gpu/``, ``telemetry/``)."""
    return [f for path in paths for f in (sorted(path.glob("node*.jsonl")) if path.is_dir() else [path])]


def metrics_sources(found: dict[str, list[Path]]) -> list[Path]:
    """Every file of metrics rows among a run's files: its ``metrics.jsonl`` and its rank telemetry."""
    return [*found["metrics.jsonl"], *_in_folders(found.get("telemetry", []))]


def _collected(run: Any) -> Optional[dict[str, list[Path]]]:
    """The collector's copies, when the run has ended and they are whole (None: not so)."""
    from ..live import layout

    info, plan = run.info, run.plan
    whole = info.state.is_over and info.logs_complete and (layout.live_dir(run.path) / layout.STATE).exists()
    if not whole or layout.readable_here(plan, run.path) is not None:
        return None  # (a run whose files are here reads them, as fetch names them)
    return {"metrics.jsonl": layout.node_files(run.path, plan, layout.METRICS),
            "summary.json": layout.node_files(run.path, plan, layout.SUMMARY), "gpu": layout.gpu_files(run.path, plan),
            "telemetry": layout.telemetry_files(run.path, plan)}


def _already_here(run: Any, name: str) -> list[Path]:
    here = Path(run.plan.run_dir).expanduser() / name
    return sorted(run.path.glob(f"fetched/node*/{name}")) or ([here] if here.exists() else [])


def report_of(runs: list[Any], *, plot: Optional[PathLike] = None, fetch: bool = True,
              tensorboard: Optional[PathLike] = None, html: Optional[PathLike] = None) -> Report:
    """The report of ``runs`` (Run handles): each one's metrics summed up, side by side; with ``plot``
    (a folder), their figures as PNG files; with ``tensorboard`` (a folder), each run's TensorBoard
    event files in ``<folder>/<run_id>/``; with ``html`` (a file), their pages in one self-contained
    HTML file."""
    pairs = [run_series(r, fetch, rows=plot is not None) for r in runs]
    if tensorboard is not None:
        for run in runs:
            write_tensorboard(run, Path(tensorboard) / run.run_id, fetch=False)
    if html is not None:
        write_html(runs, Path(html), [p[1] for p in pairs])
    result = Report([p[1] for p in pairs], [p[0] for p in pairs])
    if plot is not None:
        from ..metrics.plots import draw

        result.plots = draw(result.series, result.summaries, Path(plot))
    return result


def write_tensorboard(run: Any, folder: Path, fetch: bool = False) -> Path:
    """A run's TensorBoard event files in ``folder`` from its metrics and GPU samples, as its follower
    writes them live (``export.tensorboard``); the folder."""
    from ..live.exports import LiveExports

    found, _ = run_files(run, fetch)
    exports = LiveExports(run._dir, tensorboard=str(folder),
                          sources=(metrics_sources(found), _in_folders(found["gpu"])))
    exports.update(force=True, state=str(run.info.state))
    exports.close()
    if exports.problems:
        raise UsageError(f"report --tensorboard: {exports.problems[0]}", "give a folder this user can write")
    return folder


def write_html(runs: list[Any], path: Path, summaries: Optional[list[RunSummary]] = None) -> Path:
    """The runs' pages, as the dashboard shows them, in one file that opens without any network (with
    each of ``summaries``' table of ranks)."""
    from ..web.report_html import run_report_data, write_report

    data = []
    for run in runs:
        found, _ = run_files(run, fetch=False)
        data.append(run_report_data(run, metrics_sources(found), _in_folders(found["gpu"])))
    try:
        return write_report(path, data, summaries or ())
    except OSError as exc:
        raise UsageError(f"report --html {path}: cannot write it ({exc.strerror})", "give a file in a folder you can "
                         "write") from None


def goodput_of(run: Any, fetch: bool = True) -> Optional[Any]:
    """The goodput account (``fsdpctl.accounting``) of ``run`` (a ``Run``) from its start to its end, or to
    now while it is live (None: no attempt of it has a timeline yet), from its files (brought back from
    its nodes first when ``fetch``)."""
    from ..accounting.cache import account_of_dir

    found, _ = run_files(run, fetch)
    return account_of_dir(run._dir, metrics_sources(found))
