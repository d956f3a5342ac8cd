"""Collective smoke test: all-reduce and all-gather bandwidth over every rank, under torchrun.

``python -m fsdpctl.workload.collectives [--sizes 1K,1M,16M] [--iters N]`` (``fsdpctl doctor
--collectives`` launches it like the training job). Bandwidths follow nccl-tests: algbw = bytes /
time; busbw = algbw * 2(n-1)/n for all-reduce and (n-1)/n for all-gather, so busbw is comparable
to the link speed whatever the number of ranks. Rank 0 prints one ``fsdpctl.collectives: {json}``
line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

PREFIX = "fsdpctl.collectives"
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``64K`` -> 65536 bytes."""
    text = text.strip().upper().rstrip("B")
    scale = _UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in _UNITS else text
    if not number.isdigit() or int(number) <= 0:
        raise ValueError(f"{text!r} is not a size like 64K or 16M")
    return int(number) * scale


def process_group_backend(use_cuda: bool) -> str:
    """NCCL for the timed collectives on GPUs, and gloo beside it: the ranks agree on each median
    with a CPU tensor, which an NCCL-only group rejects ("No backend type associated with device
    type cpu")."""
    return "cpu:gloo,cuda:nccl" if use_cuda else "gloo"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_collective(kind: str, size: int, iters: int, device: torch.device, world: int) -> float:
    """Median seconds of one ``kind`` collective of ``size`` bytes (float32), after a warm-up."""
    count = max(1, size // 4)
    tensor = torch.ones(count, dtype=torch.float32, device=device)
    gathered = torch.empty(count * world, dtype=torch.float32, device=device) if kind == "all_gather" else None

    def once() -> None:
        if kind == "all_reduce":
            dist.all_reduce(tensor)
        else:
            dist.all_gather_into_tensor(gathered, tensor)

    for _ in range(2):
        once()
    _sync(device)
    times = []
    for _ in range(iters):
        dist.barrier()
        started = time.perf_counter()
        once()
        _sync(device)
        times.append(time.perf_counter() - started)
    # Every rank must agree on the time: the slowest rank's median is the collective's.
    median = torch.tensor(sorted(times)[len(times) // 2], dtype=torch.float64)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return float(median)


@record
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fsdpctl.workload.collectives", description=__doc__)
    parser.add_argument("--sizes", default="", help="comma-separated sizes (default: 1K..64M on GPU, 1K..4M on CPU)")
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions per size")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    args, _ = parser.parse_known_args(argv)  # the launcher may pass training flags too: ignored here
    device = join_group(args.device)
    use_cuda = device.type == "cuda"
    world, rank = dist.get_world_size(), dist.get_rank()
    default = "1K,64K,1M,16M,64M" if use_cuda else "1K,64K,1M,4M"
    try:
        sizes = [parse_size(s) for s in (args.sizes or default).split(",")]
    except ValueError as exc:
        if rank == 0:
            print(f"{PREFIX}: --sizes: {exc}; write e.g. --sizes 1K,1M", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        os._exit(2)
    results = []
    for kind, factor in (("all_reduce", 2 * (world - 1) / world), ("all_gather", (world - 1) / world)):
        for size in sizes:
            seconds = time_collective(kind, size, args.iters, device, world)
            algbw = size / seconds / 1e9
            results.append({"op": kind, "bytes": size, "seconds": seconds, "algbw_gbps": algbw,
                            "busbw_gbps": algbw * factor})
    finish(PREFIX, rank, {"backend": "nccl" if use_cuda else "gloo", "world_size": world, "device": device.type,
                          "results": results})


def join_group(choice: str) -> torch.device:
    """This rank's device for ``--device`` (``auto``: CUDA when there is one; each rank its
    LOCAL_RANK's GPU), with the process group joined on it."""
    use_cuda = choice == "cuda" or (choice == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(process_group_backend(use_cuda))
    return torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")


def finish(prefix: str, rank: int, summary: dict) -> None:
    """Rank 0 prints the check's one result line; every rank leaves the group and exits 0 (the checks
    doctor runs: collectives, compute, links)."""
    if rank == 0:
        print(f"{prefix}: {json.dumps(summary)}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo can abort at interpreter exit (see train.py)


if __name__ == "__main__":
    main()
