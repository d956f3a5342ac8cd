"""The bundled workload's settings: one frozen dataclass, shared by the CLI and the trainer.

Standard library only: the CLI process imports this module to validate a profile's ``train``
section and to turn it into command-line flags, and it must never pull in torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
from dataclasses import dataclass, fields
from typing import Any, Literal, Optional, get_args, get_origin

REQUEUE_MARKER = "requeue-requested"
"""Left in run_dir by a run that saved on SIGUSR2: the job's script (or submitit task) requeues it."""
STOP_MARKER = ".fsdpctl-stop"
"""Left in ``$FSDPCTL_RUN_DIR`` by fsdpctl before it gives the ranks their stop signal (``fsdpctl
stop``, a launcher's Ctrl-C or SIGTERM): a rank that then saves and exits does so with 0, the stop
being asked for; the node agent removes it when the next attempt starts."""
DEFAULT_STEPS = 100
"""Optimizer steps a run takes when it sets neither ``steps`` nor ``epochs``."""
ESTIMATE_SETTINGS = ("preset", "fsdp", "sharding", "mixed_precision", "activation_checkpointing", "cpu_offload",
                     "batch_size", "seq_len", "vocab_size", "model_vocab_size", "auto_wrap")
"""The workload settings that shape a training step's memory: what an estimate is asked with."""

Preset = Literal["tiny", "small", "gpt2-124m"]
FsdpVersion = Literal[1, 2]
Sharding = Literal["full", "grad-op", "no-shard", "hybrid"]
MixedPrecision = Literal["auto", "bf16", "fp16", "fp32"]
BackwardPrefetch = Literal["pre", "post", "none"]
AutoWrap = Literal["transformer", "size"]
Optimizer = Literal["adamw", "sgd"]
Device = Literal["auto", "cuda", "cpu"]


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything the bundled GPT training run can be told. Field names are the flag names
    with ``-`` for ``_`` (``batch_size`` is ``--batch-size``)."""

    # model and data
    preset: Preset = "tiny"
    """Model size: tiny (CPU tests), small (~10-20M params), gpt2-124m (GPU)."""
    dataset: str = "builtin"
    """builtin (text already on the machine), wikitext2, or a path to a text file or folder."""
    data_dir: Optional[str] = None
    """Folder holding wiki.train.raw / wiki.valid.raw / wiki.test.raw for --dataset wikitext2."""
    cache_dir: Optional[str] = None
    """Where the tokenizer and encoded tokens are cached (default: ~/.cache/fsdpctl)."""
    vocab_size: int = 5000
    """Size of the byte-level BPE trained locally on the corpus."""
    model_vocab_size: Optional[int] = None
    """Embedding and output-head rows; null: the tokenizer's size padded to 64 (gpt2-124m: 50304)."""
    seq_len: int = 128
    """Tokens per training sequence (must not exceed the preset's context length)."""
    val_fraction: float = 0.1
    """Share of the corpus held out for validation when the dataset has no split of its own."""

    # loop
    steps: Optional[int] = None
    """Optimizer steps to run; mutually exclusive with epochs. Default: 100 (DEFAULT_STEPS) when neither is set."""
    epochs: Optional[int] = None
    """Passes over the training split; mutually exclusive with steps."""
    batch_size: Optional[int] = None
    """Sequences per rank per micro-step; null: 8 on CPU, the preset's GPU batch on a GPU (gpt2-124m: 32)."""
    grad_accum: int = 1
    """Micro-steps per optimizer step."""
    optimizer: Optimizer = "adamw"
    """adamw (fused on CUDA) or sgd (used by exactness tests)."""
    lr: float = 3e-4
    """Peak learning rate."""
    min_lr: float = 3e-5
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 10
    """Linear warm-up steps before the cosine decay."""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (not on norms and biases)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    seed: int = 1337
    """Seed for weights and data order (identical on every rank)."""

    # evaluation and logging
    eval_interval: int = 50
    """Run validation every N steps (and always at the end); 0: only at the end."""
    eval_steps: int = 10
    """Validation batches per evaluation."""
    log_interval: int = 1
    """Print a metrics line and append to metrics.jsonl every N steps."""
    run_dir: str = "."
    """Where metrics.jsonl, summary.json and checkpoints/ are written."""

    # parallelism
    device: Device = "auto"
    """auto: CUDA when available, else CPU."""
    fsdp: FsdpVersion = 2
    """2: fully_shard (per-parameter DTensor sharding); 1: FullyShardedDataParallel."""
    sharding: Sharding = "full"
    """full (ZeRO-3), grad-op (ZeRO-2), no-shard (DDP), hybrid (shard in a node, replicate across)."""
    mixed_precision: MixedPrecision = "auto"
    """auto: bf16 on a CUDA device that supports it, fp32 on CPU."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in the backward pass."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in host memory."""
    backward_prefetch: BackwardPrefetch = "pre"
    """FSDP1 only: prefetch the next all-gather before (pre) or after (post) the current gradient."""
    auto_wrap: AutoWrap = "transformer"
    """FSDP1 only: wrap each transformer block, or wrap by parameter count."""
    reshard_after_forward: Optional[bool] = None
    """FSDP2 only: free gathered parameters after forward or keep them; null: follow --sharding."""
    compile: bool = False
    """torch.compile each block (CUDA only)."""
    rank_timing: bool = True
    """Time each rank's compute, collectives and data per logged window (metrics.jsonl ``ranks``); name a straggler."""
    memory_report: Optional[bool] = None
    """Measure step 2's peak allocated memory per rank, print fsdpctl's estimate beside it; null: on GPUs."""

    # checkpoints
    checkpoint_interval: int = 0
    """Save a sharded (DCP) checkpoint every N steps; 0: only at the end."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    no_checkpoint: bool = False
    """Save no checkpoint at all (not even at the end)."""
    resume: bool = False
    """Continue from the newest complete checkpoint in run_dir/checkpoints."""
    resume_if_present: bool = False
    """Continue from the newest complete checkpoint if run_dir has one, else start afresh (a requeued job)."""
    checkpoint_on_signal: bool = False
    """On SIGUSR2/SIGTERM every rank stops after the same step and saves; SIGUSR2 exits 0 with a requeue marker."""
    export_full: Optional[str] = None
    """At the end, write a consolidated state dict loadable into a plain GPT."""


CONFIG_FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in fields(TrainConfig)}


class ConfigError(ValueError):
    """A setting that is unknown, of the wrong type, or out of range; the message names it."""

    def __init__(self, name: str, problem: str, fix: str):
        super().__init__(f"{name}: {problem}; {fix}")
        self.name = name
        self.problem = problem
        self.fix = fix


def flag_name(name: str) -> str:
    """``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    args = get_args(annotation)
    if get_origin(annotation) is not None and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return annotation, False


def _annotation(name: str) -> Any:
    # `from __future__ import annotations` leaves strings; resolve them in this module.
    return eval(CONFIG_FIELDS[name].type, globals())  # noqa: S307 - our own literal annotations


def describe_type(name: str) -> str:
    """Human description of what a setting accepts, for error messages and docs."""
    annotation, optional = _unwrap_optional(_annotation(name))
    if get_origin(annotation) is Literal:
        text = "one of " + ", ".join(str(c) for c in get_args(annotation))
    else:
        text = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[annotation]
    return text + (" (or null)" if optional else "")


def coerce_value(name: str, value: Any) -> Any:
    """Check one setting's value against its declared type; returns the value (ints widened to
    floats where a float is declared). Raises ConfigError naming the setting."""
    if name not in CONFIG_FIELDS:
        close = difflib.get_close_matches(name, CONFIG_FIELDS, n=1)
        fix = f"did you mean '{close[0]}'?" if close else "see `python -m fsdpctl.workload.train --help`"
        raise ConfigError(name, "unknown setting", fix)
    annotation, optional = _unwrap_optional(_annotation(name))
    if value is None:
        if optional:
            return None
        raise ConfigError(name, "must not be null", f"give {describe_type(name)}")
    if get_origin(annotation) is Literal:
        choices = get_args(annotation)
        for choice in choices:
            if value == choice and type(value) is type(choice):
                return choice
            if isinstance(choice, int) and isinstance(value, str) and value == str(choice):
                return choice
        raise ConfigError(name, f"{value!r} is not allowed", f"use {describe_type(name)}")
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[annotation]
    if not ok:
        raise ConfigError(name, f"{value!r} is not {describe_type(name)}", f"give {describe_type(name)}")
    return float(value) if annotation is float else value


_POSITIVE = ("vocab_size", "model_vocab_size", "seq_len", "batch_size", "grad_accum", "eval_steps", "log_interval",
             "keep_checkpoints")
_NON_NEGATIVE = ("warmup_steps", "eval_interval", "checkpoint_interval", "grad_clip",
                 "weight_decay", "min_lr")


def check_ranges(values: dict[str, Any]) -> None:
    """Reject impossible values among the given settings (a partial mapping is fine)."""
    for name in _POSITIVE:
        if name in values and values[name] is not None and values[name] <= 0:
            raise ConfigError(name, f"{values[name]} is not positive", "give a value above 0")
    for name in _NON_NEGATIVE:
        if name in values and values[name] is not None and values[name] < 0:
            raise ConfigError(name, f"{values[name]} is negative", "give 0 or more")
    for name in ("steps", "epochs"):
        if values.get(name) is not None and values[name] <= 0:
            raise ConfigError(name, f"{values[name]} is not positive", "give a value above 0")
    if values.get("steps") is not None and values.get("epochs") is not None:
        raise ConfigError("steps", "both steps and epochs are set", "set only one of them")
    if "lr" in values and values["lr"] <= 0:
        raise ConfigError("lr", f"{values['lr']} is not positive", "give a learning rate above 0")
    if "val_fraction" in values and not 0 < values["val_fraction"] < 1:
        raise ConfigError("val_fraction", f"{values['val_fraction']} is outside (0, 1)",
                          "give a fraction such as 0.1")
    if values.get("checkpoint_on_signal") and values.get("no_checkpoint"):
        raise ConfigError("checkpoint_on_signal", "cannot save with --no-checkpoint",
                          "drop one of --checkpoint-on-signal and --no-checkpoint")
    if values.get("vocab_size") is not None and values["vocab_size"] < 260:
        raise ConfigError("vocab_size", f"{values['vocab_size']} is below 260",
                          "a byte-level BPE needs at least 256 byte tokens plus specials")


def make_config(values: dict[str, Any]) -> TrainConfig:
    """Build a TrainConfig from a mapping of setting names (snake or kebab case) to values."""
    checked = {}
    for raw_name, value in values.items():
        name = str(raw_name).replace("-", "_")
        checked[name] = coerce_value(name, value)
    check_ranges(checked)
    return TrainConfig(**checked)


def to_argv(values: dict[str, Any]) -> list[str]:
    """Turn checked settings into flags for ``python -m fsdpctl.workload.train``.

    Booleans become ``--flag`` / ``--no-flag``; None values are left out (the default applies)."""
    argv: list[str] = []
    for name, value in values.items():
        name = name.replace("-", "_")
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag_name(name) if value else "--no-" + name.replace("_", "-"))
        else:
            argv += [flag_name(name), str(value)]
    return argv


class _BoolFlag(argparse.Action):
    """``--flag`` sets True, ``--no-flag`` sets False. Unlike argparse.BooleanOptionalAction it
    keys on the exact negative spelling, so a field named ``no_checkpoint`` works:
    ``--no-checkpoint`` is True and ``--no-no-checkpoint`` is False (what to_argv writes)."""

    def __init__(self, option_strings, dest, default=None, help=None):
        self.negative = "--no-" + option_strings[0][2:]
        super().__init__([option_strings[0], self.negative], dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string != self.negative)

    def format_usage(self) -> str:
        return " | ".join(self.option_strings)


class _Parser(argparse.ArgumentParser):
    """Reports a bad command line as a ConfigError (one line) instead of usage text + exit."""

    def error(self, message: str):  # type: ignore[override]
        fix = f"see `{self.prog} --help`"
        if message.startswith("unrecognized arguments:"):
            unknown = message.split(":", 1)[1].split()[0].split("=")[0]
            close = difflib.get_close_matches(unknown, list(self._option_string_actions), n=1)
            fix = f"did you mean {close[0]}?" if close else fix
        raise ConfigError("command line", message, fix)


def build_parser() -> argparse.ArgumentParser:
    """The trainer's argument parser, generated from TrainConfig so flags and fields never drift.

    A malformed command line (unknown flag, missing value) raises ConfigError."""
    parser = _Parser(
        prog="python -m fsdpctl.workload.train",
        description="Train the bundled GPT with FSDP1 or FSDP2 (under torchrun or as one process).",
    )
    parser.add_argument("--config", help="JSON file of settings; flags given as well override it")
    for name, f in CONFIG_FIELDS.items():
        help_text = (_field_doc(name) or "") + f" [default: {f.default}]"
        annotation, _ = _unwrap_optional(_annotation(name))
        if annotation is bool:
            parser.add_argument(flag_name(name), dest=name, action=_BoolFlag,
                                default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag_name(name), dest=name, default=argparse.SUPPRESS,
                                metavar=name.upper(), help=help_text)
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    """Parse trainer flags (and an optional --config JSON file) into a checked TrainConfig.

    Raises ConfigError for a bad value, an unknown flag or a missing value."""
    namespace = vars(build_parser().parse_args(argv))
    config_path = namespace.pop("config", None)
    values: dict[str, Any] = {}
    if config_path:
        try:
            with open(config_path, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except (OSError, ValueError) as exc:
            raise ConfigError("config", f"cannot read {config_path} ({exc})",
                              "give a readable JSON file of settings") from None
        if not isinstance(loaded, dict):
            raise ConfigError("config", f"{config_path} does not hold a JSON object",
                              "write settings as {\"name\": value}")
        values.update(loaded)
    for name, text in namespace.items():
        values[name] = text if isinstance(text, bool) else _parse_flag_text(name, text)
    return make_config(values)


def _parse_flag_text(name: str, text: str) -> Any:
    annotation, optional = _unwrap_optional(_annotation(name))
    if optional and text.lower() in ("none", "null"):
        return None
    if get_origin(annotation) is Literal:
        return text
    try:
        if annotation is int:
            return int(text)
        if annotation is float:
            return float(text)
    except ValueError:
        raise ConfigError(name, f"{text!r} is not {describe_type(name)}",
                          f"give {describe_type(name)}") from None
    return text


def _field_doc(name: str) -> str | None:
    return FIELD_DOCS.get(name)


def field_docs(cls: type) -> dict[str, str]:
    """A dataclass's field docstrings (the string literal after each field), read from its source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    docs: dict[str, str] = {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, following in zip(body, body[1:], strict=False):
        is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if is_field and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = str(following.value.value)
    return docs


FIELD_DOCS: dict[str, str] = field_docs(TrainConfig)
