"""``fsdpctl estimate``: will a training step fit the GPUs, and with which sharding?"""

from __future__ import annotations

import json
from typing import Optional

import typer

from .complete import profile_completion

GIB = float(1 << 30)


def estimate(
    profile: Optional[str] = typer.Option(None, "-p", "--profile", autocompletion=profile_completion,
                                          help="A profile: its train settings, hosts and "
                                          "GPU memory."),
    preset: Optional[str] = typer.Option(None, "--preset", help="The bundled GPT's size: tiny, small, gpt2-124m."),
    model: Optional[str] = typer.Option(None, "--model", metavar="MODULE:FACTORY", help="Your model: a function "
                                        "returning an nn.Module (built into fake tensors: nothing is allocated)."),
    wrap: Optional[str] = typer.Option(None, "--wrap", metavar="CLASS", help="With --model: the block class FSDP "
                                       "shards (e.g. TransformerEncoderLayer)."),
    input_shape: Optional[str] = typer.Option(None, "--input-shape", metavar="B,S,...", help="With --model: its "
                                              "input's shape; B is the batch."),
    input_dtype: str = typer.Option("float32", "--input-dtype", metavar="float32|int64", help="With --model."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="Nodes (default: the profile's, else 1)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", min=1, help="GPUs per node."),
    fsdp: Optional[int] = typer.Option(None, "--fsdp", min=1, max=2, help="FSDP version: 1 or 2."),
    sharding: Optional[str] = typer.Option(None, "--sharding", help="full, grad-op, no-shard or hybrid."),
    mixed_precision: Optional[str] = typer.Option(None, "--mixed-precision", help="auto, bf16, fp16 or fp32."),
    activation_checkpointing: Optional[bool] = typer.Option(
        None, "--activation-checkpointing/--no-activation-checkpointing",
        help="The step estimated: with (or without) activation checkpointing; default: the profile's train "
             "setting. The choices that fit are traced with and without it anyway."),
    cpu_offload: Optional[bool] = typer.Option(None, "--cpu-offload/--no-cpu-offload",
                                               help="The step estimated: with (or without) CPU offload; default: "
                                                    "the profile's train setting."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", min=1, help="Sequences per GPU per step."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, help="Tokens per sequence."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", metavar="SIZE", help="Memory of each GPU (80GiB); "
                                          "default: the profile's."),
    choices: bool = typer.Option(True, "--choices/--no-choices", help="Also trace every sharding, checkpointing "
                                 "and offload choice against the GPU memory."),
    as_json: bool = typer.Option(False, "--json", help="The report as JSON on stdout."),
) -> None:
    """Peak memory per GPU of one training step, traced (no GPU needed), broken down, with the
    choices of sharding, activation checkpointing and CPU offload that fit and the largest batch."""
    import fsdpctl

    from .events import EventPrinter
    from .options import input_shape as parse_shape

    shape = parse_shape(input_shape) or None
    report = fsdpctl.estimate(profile, preset=preset, model=model, wrap=wrap, input_shape=shape,
                              input_dtype=input_dtype, nodes=nodes, nproc_per_node=nproc_per_node, fsdp=fsdp,
                              sharding=sharding, mixed_precision=mixed_precision,
                              activation_checkpointing=activation_checkpointing, cpu_offload=cpu_offload,
                              batch_size=batch_size, seq_len=seq_len, gpu_mem=gpu_mem, choices=choices,
                              on_event=EventPrinter(quiet_progress=True))
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
        return
    show(report)


def gib(size: Optional[int]) -> str:
    return "-" if size is None else f"{size / GIB:.2f} GiB"


def show(report) -> None:
    """The report for a terminal: the step asked, its breakdown, then the choices."""
    data = report.to_json()
    asked, settings = data["asked"], data["settings"]
    what = settings.get("model") or settings.get("preset") or "tiny"
    typer.echo(f"{what}: FSDP{settings.get('fsdp', 2)} {report.asked.label()}, {data['precision']}, batch "
               f"{data['batch_size']} x {settings.get('seq_len') or 128}, {report.world} rank(s) ({report.nodes} "
               f"node(s) x {report.nproc_per_node}); {data['params'] or '?'} parameters; traced on {report.where} "
               f"in {report.seconds:.1f} s")
    if not asked["traced"]:
        typer.secho(f"not traced ({asked['error']}): the model-state formula stands in", fg="yellow")
    where = f" in {asked['phase']}" + (f", at {asked['module']}" if asked["module"] else "") if asked["phase"] else ""
    typer.echo(f"peak per GPU: {gib(asked['peak_bytes'])}{where}")
    for name, size in sorted(asked["breakdown"].items(), key=lambda item: -item[1]):
        typer.echo(f"  {name:32s} {gib(size):>12s}")
    if asked.get("host_bytes"):
        typer.echo(f"  (in host memory, offloaded: {gib(asked['host_bytes'])})")
    typer.echo(f"model states by the ZeRO formula: {gib(asked['model_state_bytes'])} (parameters, gradients, "
               "AdamW; the trace adds activations and temporaries)")
    if report.gpu_memory is None:
        typer.echo("GPU memory unknown: give --gpu-mem (or a profile that says gpu_memory) for the choices that fit")
        return
    margins = "; ".join(data["margins"]["assumptions"])
    typer.echo(f"\non {gib(report.gpu_memory)} per GPU, keeping for what no trace sees: {margins}")
    if asked["fits"] is not None:
        colour = "green" if asked["fits"] else "red"
        typer.secho(f"asked: needs {gib(asked['needed_bytes'])}: {'fits' if asked['fits'] else 'DOES NOT FIT'} "
                    f"({gib(asked['left_bytes'])} left)", fg=colour)
    if report.choices:
        typer.echo(f"\n{'choice (fastest first)':42s} {'peak':>11s} {'needed':>11s} {'left':>11s}")
        for choice, row in zip(report.choices, data["choices"], strict=True):
            mark = "  <- fastest that fits" if report.best is not None and choice.key == report.best.key else ""
            fits = "fits" if row["fits"] else "no" if row["fits"] is not None else "?"
            typer.echo(f"{choice.label():42s} {gib(row['peak_bytes']):>11s} {gib(row['needed_bytes']):>11s} "
                       f"{gib(row['left_bytes']):>11s}  {fits}{mark}")
    if report.best is None and report.choices:
        typer.secho("no choice fits: more GPUs (--nodes), a smaller batch, or a smaller model", fg="red")
    elif report.max_batch:
        typer.echo(f"largest batch for {report.best.label()}: {report.max_batch} per GPU "
                   f"(traced: {gib(data['max_batch_peak_bytes'])} peak)")
