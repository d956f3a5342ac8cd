"""The ceiling the workload's GPU speed is held to: the same GPT in a plain single-GPU loop, no FSDP.

Same model class and initialisation as the workload, bf16 autocast, fused AdamW with the same
decay groups, gradient clipping; random tokens already on the GPU (no data pipeline, no logging).
``--compile`` compiles the whole model, loss included (what a user of one GPU would write).
Timed like the workload: the device is synchronised only at the end of each window of
``--window`` steps, the first window (warm-up, compilation) is left out, and the median window
gives tokens/s. Prints one JSON line.

Run: python bench/gpu_reference.py [--compile] [--batch-size 32] [--model-vocab-size 50304]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fsdpctl.workload.metrics import device_peak_flops  # noqa: E402
from fsdpctl.workload.model import GPT, PRESETS, GPTConfig, count_params, flops_per_token, padded_vocab  # noqa: E402


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The workload's groups: no decay on biases and norms."""
    decay, plain = [], []
    for name, param in model.named_parameters():
        (plain if name.endswith("bias") or ".ln_" in name or "ln_f." in name else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2-124m")
    parser.add_argument("--model-vocab-size", type=int, default=50304)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()

    device = torch.device("cuda")
    dims = {k: v for k, v in PRESETS[args.preset].items() if k in GPTConfig.__dataclass_fields__}
    config = GPTConfig(vocab_size=padded_vocab(args.model_vocab_size), **dims)
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device=device)
    model.init_weights(1337)
    optimizer = torch.optim.AdamW(decay_groups(model, 0.1), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    forward = torch.compile(model) if args.compile else model
    generator = torch.Generator(device=device).manual_seed(0)
    data = torch.randint(0, config.vocab_size, (8, args.batch_size, args.seq_len + 1), device=device,
                         generator=generator)
    windows, start = [], None
    for step in range(args.steps):
        batch = data[step % len(data)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = forward(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % args.window == 0:
            torch.cuda.synchronize()
            now = time.perf_counter()
            if start is not None:
                windows.append((now - start) / args.window)
            start = now
    step_time = statistics.median(windows)
    tokens_per_s = args.batch_size * args.seq_len / step_time
    peak = device_peak_flops(device)
    flops = flops_per_token(config, args.seq_len)
    print(json.dumps({
        "case": "reference" + ("+compile" if args.compile else ""), "batch_size": args.batch_size,
        "seq_len": args.seq_len, "model_vocab_size": config.vocab_size, "params": count_params(config),
        "tokens_per_s": round(tokens_per_s), "mfu": round(flops * tokens_per_s / peak, 4) if peak else None,
        "window_tokens_per_s": [round(args.batch_size * args.seq_len / w) for w in windows],
        "peak_memory_mb": round(torch.cuda.max_memory_allocated() / 2**20), "final_loss": float(loss),
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
