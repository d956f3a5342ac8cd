"""What the export writers cost the launcher's CPU on a 16 x 8-GPU run, this tree's against those of
``--rev``, in one run (interleaved repeats, CPU seconds of this process, all threads):

  TensorBoard: N scalars with the tags a 16 x 8 run writes (per step: 5 run figures and 4 per rank for
      128 ranks; per GPU sample: 6 figures for each of 128 GPUs), flushed every 2,000 scalars as the
      collector flushes every 2 s, through
        old:       fsdpctl.export.tensorboard of --rev (e2f25a3: the hand-written writer, protobuf
                   fields and CRC32C in Python)
        new:       this tree's (tensorboardX's Event protobufs, google-crc32c's C CRC), one scalar each
        tbx:       tensorboardX's own SummaryWriter.add_scalar, the writer not taken (for the record)
  Prometheus: M textfiles of that run (9 DCGM GPU families x 128 GPUs, 4 rank families x 128 ranks, the
      run's own figures), each rendered and replaced atomically, through
        old:       fsdpctl.export.prometheus of --rev (e2f25a3: the hand-written text; 9d7badc:
                   prometheus_client's registry and generate_latest)
        new:       this tree's (the text generate_latest writes, formatted once per label set)
Both outputs are read back (prometheus_client's parser; TensorBoard's loader) and must say the same.
Run from the repository (no root needed):
  .venv/bin/python bench/export_writers.py [--events 50000] [--textfiles 100] [--repeats 5] [--rev HEAD]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import interleaved, report, summarize  # noqa: E402

from fsdpctl.export import prometheus as new_prometheus  # noqa: E402
from fsdpctl.export import tensorboard as new_tensorboard  # noqa: E402
from fsdpctl.live.exports import GPU_FIGURES, RANK_FIGURES, RUN_FIGURES  # noqa: E402

NODES, GPUS = 16, 8
FLUSH_EVERY = 2000


def old_module(rev: str, path: str, name: str, folder: Path):
    """``path`` as it was at ``rev``, imported as ``name`` (the hand-written writers import the stdlib only)."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout
    file = folder / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def scalars(count: int) -> list[tuple[str, float, int, float]]:
    """``count`` scalars in the mix a 16 x 8 run writes: a step's rows, then a second's GPU samples, in turn."""
    step_tags = [tag for _, tag, _, _ in RUN_FIGURES]
    step_tags += [f"rank{r}/{name}" for r in range(NODES * GPUS) for _, name, _, _ in RANK_FIGURES]
    gpu_tags = [f"gpu/node{n}/gpu{g}/{name}" for n in range(NODES) for g in range(GPUS)
                for _, name, _, _ in GPU_FIGURES]
    out: list[tuple[str, float, int, float]] = []
    step, wall = 0, 1.7e9
    while len(out) < count:
        step, wall = step + 1, wall + 1.0
        out += [(tag, 0.1 + (i % 97) / 7.0, step, wall) for i, tag in enumerate(step_tags)]
        out += [(tag, 1980.0 - (i % 13), step, wall) for i, tag in enumerate(gpu_tags)]
    return out[:count]


def families(module) -> list:
    """The textfile's families of a 16 x 8 run, as ``LiveExports.families`` makes them, in ``module``'s Family."""
    family = module.Family
    base = {"run": "big-20261127-120000-abcd"}
    out = [family("fsdpctl_run_info", "The run (labels) and its state; 1 while it goes.", "gauge",
                  [({**base, "profile": "big", "backend": "ssh", "state": "running"}, 1.0)]),
           family("fsdpctl_step", "Newest logged training step.", "gauge", [(base, 1234.0)])]
    out += [family(name, words + ".", "gauge", [(base, 0.5)]) for _, _, name, words in RUN_FIGURES]
    ranks = [{**base, "rank": str(r), "node": str(r // GPUS), "host": f"10.0.{r // GPUS}.1"}
             for r in range(NODES * GPUS)]
    out += [family(name, words + " in the newest window.", "gauge", [(labels, 0.1 + r / 1000) for r, labels
                                                                     in enumerate(ranks)])
            for _, _, name, words in RANK_FIGURES]
    gpus = [{**base, "gpu": str(g), "node": str(n), "host": f"10.0.{n}.1", "Hostname": f"10.0.{n}.1",
             "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0"} for n in range(NODES) for g in range(GPUS)]
    names = [(name, words) for _, _, name, words in GPU_FIGURES]
    names += [("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
              ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (a bit mask)."),
              ("DCGM_FI_DEV_ROW_REMAP_PENDING", "Row remapping is pending (1: the GPU needs a reset).")]
    out += [family(name, words, "gauge", [(labels, 1980.0 - i) for i, labels in enumerate(gpus)])
            for name, words in names]
    return out


def cpu_of(action) -> float:
    start = time.process_time()
    action()
    return time.process_time() - start


def tensorboard_case(module, items, folder: Path):
    def run() -> float:
        def write() -> None:
            with module.EventWriter(folder) as writer:
                for i, (tag, value, step, wall) in enumerate(items, 1):
                    writer.scalar(tag, value, step, wall)
                    if i % FLUSH_EVERY == 0:
                        writer.flush()
        return cpu_of(write)
    return run


def tensorboardx_case(items, folder: Path):
    new_tensorboard._tensorboardx_messages()  # tensorboardX's package loaded as the new writer loads it

    from tensorboardX import SummaryWriter

    def run() -> float:
        def write() -> None:
            writer = SummaryWriter(str(folder), flush_secs=2)
            for tag, value, step, wall in items:
                writer.add_scalar(tag, value, step, wall)
            writer.close()
        return cpu_of(write)
    return run


def prometheus_case(module, fams, path: Path, count: int):
    def run() -> float:
        return cpu_of(lambda: [module.write_textfile(path, module.render(fams)) for _ in range(count)])
    return run


def same_output(old_tb, items, old_prom, folder: Path) -> dict[str, int]:
    """Both writers' files read back by the tools' own readers say the same (else the comparison is void)."""
    from prometheus_client.parser import text_string_to_metric_families
    from tensorboard.backend.event_processing import event_file_loader

    def parsed(text: str) -> list:
        return [(f.name, f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
                for f in text_string_to_metric_families(text)]

    old_text, new_text = old_prom.render(families(old_prom)), new_prometheus.render(families(new_prometheus))
    assert parsed(old_text) == parsed(new_text), "the two textfiles differ"
    read = {}
    for name, module in (("old", old_tb), ("new", new_tensorboard)):
        with module.EventWriter(folder / name) as writer:
            writer.scalars(items[:5000])
        loaded = list(event_file_loader.RawEventFileLoader(str(writer.path)).Load())
        read[name] = [(e.step, e.wall_time, e.summary.value[0].tag, e.summary.value[0].simple_value)
                      for e in map(new_tensorboard.Event.FromString, loaded[1:])]
    assert read["old"] == read["new"] and len(read["new"]) == 5000, "the two event files differ"
    return {"textfile_bytes": len(new_text.encode()), "textfile_samples": sum(len(f.samples) for f in families(
        new_prometheus))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--textfiles", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rev", default="HEAD", help="the revision whose writers are compared (e2f25a3: the "
                                                      "hand-written ones; 9d7badc: prometheus_client's text)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        old_tb = old_module(args.rev, "fsdpctl/export/tensorboard.py", "old_tensorboard", root)
        old_prom = old_module(args.rev, "fsdpctl/export/prometheus.py", "old_prometheus", root)
        items = scalars(args.events)
        checked = same_output(old_tb, items, old_prom, root / "check")
        (root / "textfile").mkdir()
        textfile = root / "textfile" / "fsdpctl_big.prom"
        tb = interleaved({"tensorboard old (--rev)": tensorboard_case(old_tb, items, root / "a"),
                          "tensorboard new (this tree)": tensorboard_case(
                              new_tensorboard, items, root / "b"),
                          "tensorboardX SummaryWriter (not taken)": tensorboardx_case(items, root / "c")},
                         repeats=args.repeats)
        prom = interleaved({"prometheus old (--rev)": prometheus_case(old_prom, families(old_prom), textfile,
                                                                             args.textfiles),
                            "prometheus new (this tree)": prometheus_case(
                                new_prometheus, families(new_prometheus), textfile, args.textfiles)},
                           repeats=args.repeats)
    tb_summary = summarize(tb, "tensorboard old (--rev)")
    prom_summary = summarize(prom, "prometheus old (--rev)")
    per_event = {name: row["median_s"] / args.events * 1e6 for name, row in tb_summary.items()}
    per_file = {name: row["median_s"] / args.textfiles * 1e3 for name, row in prom_summary.items()}
    # A 16 x 8 run writes about 517 scalars a step and 768 a second of GPU samples; at a step a second that is
    # 1,285 scalars a second, and a textfile every 5 s
    per_second = 517 + NODES * GPUS * len(GPU_FIGURES)
    launcher = {name: f"{us * per_second / 1e4:.2f}% of a core" for name, us in per_event.items()}
    launcher |= {name: f"{ms / 5 / 10:.2f}% of a core" for name, ms in per_file.items()}
    report("export_writers", f"old (each writer against its own at {args.rev})", {**tb_summary, **prom_summary},
           {"rev": args.rev, "events": args.events, "textfiles": args.textfiles,
            "unit": "CPU seconds of this process (all threads)",
            "tensorboard_us_per_scalar": per_event, "prometheus_ms_per_textfile": per_file,
            "launcher_cpu_16x8_run_step_per_second": launcher, "outputs_read_back_alike": checked})
    for name, us in per_event.items():
        print(f"{name:52s} {us:7.2f} us/scalar   {launcher[name]}")
    for name, ms in per_file.items():
        print(f"{name:52s} {ms:7.2f} ms/textfile {launcher[name]}")


if __name__ == "__main__":
    main()
