"""The report's figures as PNG files, drawn with matplotlib (the ``report`` extra; the only importer).

Each figure's PNG carries, as text chunks, what it shows: ``fsdpctl:figure`` and
``fsdpctl:series`` (the number of lines, bars or heat-map rows actually drawn, counted from the
axes when the file is written), so a test or a script can check a figure without looking at it.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from .rows import Series
from .summary import RunSummary

HEAT_MAP_MIN_HEIGHT = 2.8
"""Inches: room for the colour bar's label ("compute ms per step") beside the heat map of one rank."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("report --plot: matplotlib is not installed here",
                         "pip install 'fsdpctl[report]' (or matplotlib), or leave out --plot") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, figure: str, series: int) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"fsdpctl:figure": figure, "fsdpctl:series": str(series)})
    return path


def draw(runs: list[Series], summaries: list[RunSummary], folder: Path) -> list[Path]:
    """Write the figures for ``runs`` (overlaid where there are several) into ``folder``."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in runs:
        steps, loss = run.column("loss")
        if steps:
            ax.plot(steps, loss, label=f"{run.name} train")
        steps, val = run.column("val_loss", run.val or run.train)
        if steps:
            ax.plot(steps, val, "o--", label=f"{run.name} validation")
    ax.set(xlabel="step", ylabel="loss", title="Loss")
    if ax.lines:
        ax.legend()
    written.append(_save(fig, folder / "loss.png", "loss", len(ax.lines)))
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in runs:
        steps, tok = run.column("tokens_per_s")
        if steps:
            ax.plot(steps, tok, label=run.name)
    ax.set(xlabel="step", ylabel="tokens/s", title="Throughput")
    if ax.lines:
        ax.legend()
    written.append(_save(fig, folder / "throughput.png", "throughput", len(ax.lines)))
    plt.close(fig)

    for run in runs:
        windows = run.windows()
        if not windows or any("compute_s" not in e for w in windows for e in w):
            continue
        grid = [[float(w[r]["compute_s"]) * 1000 for w in windows] for r in range(len(windows[0]))]
        # The colour bar is as tall as the heat map: a few ranks' rows alone leave its label no room.
        fig, ax = plt.subplots(figsize=(9, max(HEAT_MAP_MIN_HEIGHT, 1.2 + 0.35 * len(grid))))
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
        fig.colorbar(image, ax=ax, label="compute ms per step")
        ax.set(xlabel="logged window", ylabel="rank", title=f"Compute time per rank: {run.name}")
        ax.set_yticks(range(len(grid)))  # ranks and windows are whole numbers
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        name = "step_time_ranks.png" if len(runs) == 1 else f"step_time_ranks_{_file_name(run.name)}.png"
        written.append(_save(fig, folder / name, "step time per rank", len(grid)))
        plt.close(fig)

    with_memory = [s for s in summaries if s.memory_mb_per_rank]
    if with_memory:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(with_memory)
        for i, s in enumerate(with_memory):
            xs = [r + i * width for r in range(len(s.memory_mb_per_rank))]
            ax.bar(xs, s.memory_mb_per_rank, width=width, label=s.name)
        ax.set(xlabel="rank", ylabel="peak memory (MB)", title="Memory per rank")
        ax.legend()
        written.append(_save(fig, folder / "memory.png", "memory per rank", len(ax.containers)))
        plt.close(fig)
    return written


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
