"""Train the bundled GPT with FSDP2 or FSDP1: ``python -m fsdpctl.workload.train [flags]``.

Runs under torchrun (CUDA/NCCL or CPU/gloo) or as one plain process (a one-rank gloo group).
A setting that cannot work prints one line ``fsdpctl.workload: <setting>: <problem>; <fix>`` to
stderr and exits 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import os
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ..node.events import BATCH_SPLIT, CHECKPOINT_LOADED, CHECKPOINT_SAVED, STEPS_BEGIN
from ..node.profiling import step_ended as profile_step
from . import checkpoint as ckpt
from . import data
from . import parallelize as par
from .config import DEFAULT_STEPS, ESTIMATE_SETTINGS, ConfigError, TrainConfig, parse_args
from .config_exit import PREFIX, config_exit
from .elastic import BatchSplitError, on_this_world, split_line
from .memory import StepMemory, estimate_step, report_line
from .metrics import Meter, RunLog, peak_memory_mb
from .model import GPTConfig, count_params, default_batch_size, flops_per_token, preset_config, set_timer
from .parallelize import PeerFailed, Runtime
from .sampler import Sampler
from .signals import StopSignals, clear_requeue_marker, stop_on_signal, stop_signals_for
from .timing import RankTimer, RankWindows
from .trackers import Trackers

STRAGGLER_AT = ("rank", "node", "host", "local_ranks", "ratio", "windows_slow", "windows", "whole_node")
"""What a metrics row says of where the straggler is (its ``straggler_at``), beside the verdict's text."""
# Python's automatic garbage collection is off while training: a full collection walks every object
# (modules, FSDP's state, autograd's) at moments nobody chose, and made log windows unsteady. The
# young generations are collected every GC_EVERY steps instead, at a step boundary.
GC_EVERY = 50


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr`` at ``total_steps``
    (``step`` counts from 0)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    span = max(1, total_steps - cfg.warmup_steps)
    ratio = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


@record
def main(argv: list[str] | None = None) -> None:
    start_time = time.perf_counter()
    try:
        cfg = parse_args(argv)
        # As early as possible: a signal during start-up (imports, data, resume) is kept for step 1.
        stop_signals = stop_signals_for(cfg)
        _, world, _, local_world = par.env_ranks()
        device_type = par.resolve_device_type(cfg)
        cfg = with_device_defaults(cfg, device_type)
        par.check_combination(cfg, device_type, world, local_world)
    except ConfigError as error:
        config_exit(error if local_rank_from_env() == 0 else None)  # identical on every rank
    trackers = Trackers()  # W&B / MLflow when FSDPCTL_LOG_TO asks: started on rank 0 by run()
    try:
        with trackers.ended_on_error():
            run(cfg, device_type, start_time, stop_signals, trackers)
    except ConfigError as error:
        config_exit(error)
    except PeerFailed:
        config_exit(None)


def with_device_defaults(cfg: TrainConfig, device_type: str) -> TrainConfig:
    """Settings left to the device: the batch size (see ``model.DEFAULT_BATCH``)."""
    if cfg.batch_size is None:
        cfg = dataclasses.replace(cfg, batch_size=default_batch_size(cfg.preset, device_type))
    return cfg


@contextlib.contextmanager
def steady_gc():
    """Training steps without Python's automatic garbage collection (see GC_EVERY); what exists when
    they start (the model, the optimizer) is frozen out of every later scan."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A batch onto the device without stalling the host: on a GPU through pinned memory and an
    asynchronous copy (a copy from pageable memory waits for the device to reach it, so the host
    could not queue the next step while the device works on this one)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def local_rank_from_env() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def prepare_data(cfg: TrainConfig, rt: Runtime):
    """Corpus -> cached tokenizer and token ids -> this rank's train and validation samplers.

    Every rank reads the corpus (to know its hash); local rank 0 of each node trains the
    tokenizer and encodes unless the cache has them while the others wait; then all load."""
    cache_dir = data.default_cache_dir(cfg.cache_dir)
    builder = rt.local_rank == 0
    if cfg.dataset == "wikitext2" and cfg.data_dir is None:  # download once per node, if needed
        par.agree(rt, lambda: data.fetch_wikitext2(cache_dir) if builder else None)
    corpus = par.agree(rt, lambda: data.load_corpus(cfg.dataset, cfg.data_dir, cache_dir))
    folder = data.cache_folder(cache_dir, corpus, cfg.vocab_size)
    par.agree(rt, lambda: data.build_tokens(corpus, cfg.vocab_size, folder) if builder else None)
    tokens = data.load_tokens(folder, cfg.val_fraction)
    par.check_same(rt, "dataset", tokens.corpus_digest + tokens.tokenizer_sha,
                   "ranks disagree on the corpus or tokenizer",
                   "run the same Python and data on every node (or share --cache-dir)")
    train = Sampler(tokens.train, cfg.seq_len, cfg.batch_size, rt.world, rt.rank, cfg.grad_accum,
                    cfg.seed)
    val = Sampler(tokens.val, cfg.seq_len, cfg.batch_size, rt.world, rt.rank, 1, cfg.seed)

    def check_sizes():
        if train.steps_per_epoch < 1:
            raise ConfigError("batch_size", f"the training split ({len(tokens.train)} tokens) is "
                              f"smaller than one global batch of {train.global_batch} sequences "
                              f"of {cfg.seq_len}", "lower --batch-size/--seq-len or use more data")
        if val.n_seqs < 1:
            raise ConfigError("val_fraction", f"the validation split ({len(tokens.val)} tokens) "
                              f"is shorter than one sequence", "raise --val-fraction or lower --seq-len")
    par.agree(rt, check_sizes)
    return corpus, tokens, train, val


def find_resume(cfg: TrainConfig, rt: Runtime, run_dir: Path, gpt_config: GPTConfig) -> Path | None:
    """The checkpoint to resume from (None: start afresh); refuses ambiguous run dirs."""
    def check():
        latest = ckpt.latest_checkpoint(run_dir)
        if cfg.resume_if_present and not cfg.resume:
            if latest is not None and ckpt.read_trainer_state(latest)["model_config"] != gpt_config.to_dict():
                raise ConfigError("resume_if_present", f"{latest.name} holds a different model",
                                  "resume with the settings it was saved with, or use a fresh --run-dir")
            return latest
        if cfg.resume and latest is None:
            raise ConfigError("resume", f"no complete checkpoint under {ckpt.checkpoints_dir(run_dir)}",
                              "drop --resume to start afresh, or point --run-dir at the earlier run")
        if not cfg.resume and latest is not None and not cfg.no_checkpoint:
            raise ConfigError("run_dir", f"{run_dir} already holds checkpoints (newest {latest.name})",
                              "pass --resume to continue that run, or use a fresh --run-dir")
        if cfg.resume and ckpt.read_trainer_state(latest)["model_config"] != gpt_config.to_dict():
            saved = ckpt.read_trainer_state(latest)
            raise ConfigError("resume", f"{latest.name} holds a different model ({saved['preset']}, "
                              f"vocab {saved['model_config']['vocab_size']})",
                              "resume with the preset, dataset and vocab size it was saved with")
        return latest if cfg.resume else None
    return par.agree(rt, check)


def evaluate(model, cfg: TrainConfig, rt: Runtime, sampler: Sampler) -> tuple[float, float]:
    """Mean validation loss over ``eval_steps`` batches on every rank, and its perplexity."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for x, y in sampler.val_batches(cfg.eval_steps):
            total += model(to_device(x, rt.device), to_device(y, rt.device))[1].double().cpu()
    model.train()
    if cfg.fsdp == 2:
        par.reshard_all(model)  # an eval forward without backward can leave parameters gathered
    dist.all_reduce(total)
    loss = float(total) / (cfg.eval_steps * rt.world)
    return loss, math.exp(min(loss, 50.0))


def run(cfg: TrainConfig, device_type: str, start_time: float, stop_signals: StopSignals | None = None,
        trackers: Trackers | None = None) -> None:
    rt = par.init_distributed(device_type)
    try:  # an elastic run on fewer ranks keeps its global batch
        cfg, split = on_this_world(cfg, rt.world, rt.local_world)
    except BatchSplitError as error:
        raise ConfigError("batch_size", str(error), "give a batch_size x grad_accum that divides evenly") from None
    trackers = trackers if trackers is not None else Trackers()
    # Before the data and the model: a tracker that cannot start ends the run at once, on every rank.
    par.agree(rt, lambda: trackers.start(dataclasses.asdict(cfg)) if rt.rank == 0 else None)
    torch.manual_seed(cfg.seed)
    run_dir = Path(cfg.run_dir).expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    corpus, tokens, train_sampler, val_sampler = prepare_data(cfg, rt)
    total_steps = cfg.steps or (cfg.epochs * train_sampler.steps_per_epoch if cfg.epochs else DEFAULT_STEPS)

    precision = par.resolve_precision(cfg, device_type)
    # Before the model exists: on a CPU the measurement counts every byte the allocator hands out.
    memory = StepMemory(rt.device, rt.is_cuda if cfg.memory_report is None else cfg.memory_report)
    gpt_config = preset_config(cfg.preset, tokens.vocab_size, cfg.model_vocab_size)

    def check_vocab():
        if gpt_config.vocab_size < tokens.vocab_size:
            raise ConfigError("model_vocab_size", f"{gpt_config.vocab_size} rows cannot hold the tokenizer's "
                              f"{tokens.vocab_size} tokens", f"give at least {tokens.vocab_size}, or drop it")
    par.agree(rt, check_vocab)
    n_params = count_params(gpt_config)
    model = par.build_model(cfg, gpt_config, rt, precision)
    optimizer = par.build_optimizer(cfg, model, rt, precision)
    timer = RankTimer(rt.device, cfg.rank_timing)
    if cfg.rank_timing:
        set_timer(model, timer)
    windows = RankWindows(rt, timer)
    scaler = par.make_grad_scaler(precision, rt)

    if stop_signals is not None:
        stop_signals.use_cpu_group(rt.device)
    step = 0
    latest = find_resume(cfg, rt, run_dir, gpt_config)
    loaded: Optional[tuple[float, float]] = None
    if latest is not None:
        state, loaded = ckpt.timed_load(latest, model, optimizer, rt.rank, rt.device)
        step = int(state["step"])
        train_sampler.load_state(state["sampler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])

    if rt.rank == 0 and cfg.checkpoint_on_signal:
        clear_requeue_marker(run_dir)
    log = RunLog(run_dir, rt.rank, resumed_step=step if latest is not None else None, trackers=trackers)
    tokens_per_step = rt.world * cfg.batch_size * cfg.grad_accum * cfg.seq_len
    meter = Meter(rt.device, tokens_per_step, flops_per_token(gpt_config, cfg.seq_len),
                  rt.world, start_time)
    log.print(f"{PREFIX}: world={rt.world} device={rt.device.type} fsdp={cfg.fsdp} "
              f"sharding={cfg.sharding} precision={precision} preset={cfg.preset} "
              f"params={n_params / 1e6:.2f}M vocab={tokens.vocab_size} model_vocab={gpt_config.vocab_size} "
              f"batch={cfg.batch_size} optimizer={cfg.optimizer}"
              f"{'(fused)' if cfg.optimizer == 'adamw' and par.fused_adamw(rt.device.type, precision) else ''} "
              f"dataset={corpus.name} "
              f"train_tokens={len(tokens.train)} steps={total_steps} "
              + (f"resumed_from={latest.name}" if latest else "fresh"))
    if loaded is not None:  # the goodput account's checkpoint load
        log.event(CHECKPOINT_LOADED, step=step, by="workload", began=round(loaded[0], 3), seconds=round(loaded[1], 3))
    if split is not None:  # the launcher plans a later attempt's split from it
        log.event(BATCH_SPLIT, **split)
        if (said := split_line(split)) is not None:
            log.print(f"{PREFIX}: {said}")

    def save(at_step: int) -> None:
        meter.close_window()
        began = time.time()
        state = {"step": at_step, "sampler": train_sampler.state(), "world_size": rt.world,
                 "global_batch": train_sampler.global_batch,
                 "preset": cfg.preset, "model_config": gpt_config.to_dict(),
                 "scaler": scaler.state_dict() if scaler is not None else None,
                 "corpus_digest": tokens.corpus_digest}
        par.agree(rt, lambda: ckpt.save_checkpoint(run_dir, at_step, model, optimizer, state, rt.rank,
                                                   rt.device, cfg.keep_checkpoints))
        # complete on every rank: an elastic run grows here; what it blocked the ranks, for the goodput account
        log.event(CHECKPOINT_SAVED, step=at_step, by="workload", began=round(began, 3),
                  seconds=round(time.time() - began, 3))
        meter.restart_window()
        timer.restart()

    train_loss = val_loss = val_ppl = None
    state_bytes: dict[str, int] = {}
    last_saved = first_step = step
    model.train()
    log.event(STEPS_BEGIN, step=step)
    with steady_gc():
        while step < total_steps:
            if stop_signals is not None and (received := stop_signals.agreed()):
                stop_on_signal(received, step, step - first_step, last_saved, save, run_dir, rt, log)
            lr = lr_at(step, cfg, total_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            step += 1
            memory.step_starting(step - first_step)
            step_loss = torch.zeros((), device=rt.device)
            loading = time.perf_counter()
            micro = [(to_device(x, rt.device), to_device(y, rt.device)) for x, y in train_sampler.next_step()]
            timer.data(time.perf_counter() - loading)
            for i, (x, y) in enumerate(micro):
                with par.gradient_sync(model, cfg, sync=i == len(micro) - 1):
                    # The logits (batch x seq x vocab, a step's largest tensor) are dropped at once: held
                    # in a name, they stayed alive through the backward pass and into the next step.
                    loss = model(x, y)[1] / cfg.grad_accum
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                step_loss += loss.detach()
            if scaler is not None:
                scaler.unscale_(optimizer)
            grad_norm = par.clip_gradients(model, cfg) if cfg.grad_clip > 0 else None
            if scaler is not None:
                timer.compute(scaler.step, optimizer)
                scaler.update()
            else:
                timer.compute(optimizer.step)
            if not state_bytes:  # after the first step: optimizer state exists, gradients not freed
                state_bytes = par.local_state_bytes(model, optimizer)
            optimizer.zero_grad(set_to_none=True)
            memory.step_done(step - first_step)
            if step % GC_EVERY == 0:
                gc.collect(1)
            meter.step_done()
            timer.step()
            profile_step(step)
            if step == first_step + 1:  # the first step (start-up, warm-up) is in no window
                timer.restart()
            if step % cfg.log_interval == 0 or step == total_steps:
                train_loss, ranks = windows.gather(step_loss, peak_memory_mb(rt.device))
                step_time = meter.close_window()
                tok_s = meter.tokens_per_s(step_time)
                straggler = windows.tally.verdict() if ranks else None
                log.train_line(train_sampler.epoch + 1, step, train_loss, lr, tok_s, meter.mfu(tok_s),
                               peak_memory_mb(rt.device), None if grad_norm is None else float(grad_norm),
                               extra={"step_time_s": step_time, "ranks": ranks,
                                      "straggler": straggler["text"] if straggler else None,
                                      "straggler_at": {k: straggler[k] for k in STRAGGLER_AT} if straggler else None})
            if cfg.eval_interval and step % cfg.eval_interval == 0 and step < total_steps:
                meter.close_window()
                val_loss, val_ppl = log.timed_eval(step, lambda: evaluate(model, cfg, rt, val_sampler))
                meter.restart_window()
                timer.restart()
            if (not cfg.no_checkpoint and cfg.checkpoint_interval
                    and step % cfg.checkpoint_interval == 0 and step < total_steps):
                save(step)
                last_saved = step

    val_loss, val_ppl = log.timed_eval(step, lambda: evaluate(model, cfg, rt, val_sampler))
    if not cfg.no_checkpoint and step != last_saved:
        save(step)
    if cfg.export_full:
        ckpt.export_full(cfg.export_full, model, rt.rank, rt.device, gpt_config.to_dict())

    memory.close()
    keys = ("params", "grads", "optimizer", "total")
    mine = torch.tensor([peak_memory_mb(rt.device), *(state_bytes.get(k, 0) for k in keys),
                         -1 if memory.peak_bytes is None else memory.peak_bytes],
                        dtype=torch.float64)  # byte counts stay exact in float64 below 2**53
    per_rank = [torch.zeros_like(mine) for _ in range(rt.world)]
    dist.all_gather(per_rank, mine)
    measured = [int(row[-1]) for row in per_rank]
    memory_summary = None
    if rt.rank == 0 and memory.enabled and min(measured) >= 0:
        # The settings that shape a step's memory, as this run resolved them.
        estimate = estimate_step({
            **{name: getattr(cfg, name, None) for name in ESTIMATE_SETTINGS}, "mixed_precision": precision,
            "vocab_size": tokens.vocab_size, "model_vocab_size": gpt_config.vocab_size,
            "world": rt.world, "local_world": rt.local_world, "device": rt.device.type})
        log.print(report_line(measured, estimate))
        memory_summary = {"step": first_step + 2, "measured_by": memory.measured_by,
                          "measured_peak_bytes_per_rank": measured, "estimate": estimate}
    step_time = meter.median_step_time()
    straggler = windows.tally.verdict()
    if rt.rank == 0 and windows.tally.seen:
        log.print(f"{PREFIX}: " + (straggler["text"] if straggler else
                                   "no straggler: no rank computed 1.10x the others' median in most windows"))
    log.summary(run_dir, {
        "straggler": straggler,
        "final_train_loss": train_loss, "final_val_loss": val_loss, "val_perplexity": val_ppl,
        "median_tokens_per_s": meter.tokens_per_s(step_time), "median_step_time_s": step_time,
        "median_mfu": meter.mfu(meter.tokens_per_s(step_time)),  # null where the device's peak is unknown
        "flops_per_token": meter.flops_per_token, "peak_flops_per_device": meter.peak,
        "time_to_first_step_s": meter.time_to_first_step,
        "peak_memory_mb_per_rank": [float(row[0]) for row in per_rank],
        "state_bytes_per_rank": [dict(zip(keys, map(int, row[1:-1].tolist()), strict=True))
                                 for row in per_rank],
        "step_memory": memory_summary,
        "world_size": rt.world, "ranks_per_node": rt.local_world, "device": rt.device.type,
        "fsdp": {"version": cfg.fsdp, "sharding": cfg.sharding, "mixed_precision": precision,
                 "reshard_after_forward": par.resolve_reshard(cfg, rt.world, rt.local_world) if cfg.fsdp == 2 else None,
                 "backward_prefetch": cfg.backward_prefetch if cfg.fsdp == 1 else None,
                 "auto_wrap": cfg.auto_wrap if cfg.fsdp == 1 else None,
                 "activation_checkpointing": cfg.activation_checkpointing,
                 "cpu_offload": cfg.cpu_offload, "compile": cfg.compile},
        "steps": step, "total_steps": total_steps, "tokens_per_step": tokens_per_step,
        "param_count": n_params, "preset": cfg.preset, "model_config": gpt_config.to_dict(),
        "dataset": corpus.name, "vocab_size": tokens.vocab_size,
    })
    log.end("FINISHED")
    dist.destroy_process_group()
    if rt.device.type == "cpu":
        # On CPU/gloo, FSDP1 and FSDP2 runs alike abort ("terminate called without an active
        # exception") in interpreter shutdown in a few % (FSDP2: up to ~20 %) of runs, after all
        # work is done. Everything is written and the group is gone: leave without the shutdown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
