"""Compute check: a short matmul on every rank of every node at once, under torchrun.

``python -m fsdpctl.workload.compute_check [--device cpu|cuda] [--size N] [--seconds S]`` (``fsdpctl
doctor --compute`` launches it like the training job). Each rank warms up, waits at a barrier so
every rank runs at the same time (a node's power and cooling are then loaded as in training), then
counts square matmuls for ``--seconds``: TFLOP/s = 2 n^3 matmuls / seconds / 1e12. Rank 0 prints
one ``fsdpctl.compute: {json}`` line with every rank's figure; ``fsdpctl.hostcheck.compute`` judges
it against the median.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from .collectives import finish, join_group

PREFIX = "fsdpctl.compute"
# bf16 8192^3 is ~1.1 TFLOP, a couple of ms on an H100: long enough that launch overhead vanishes,
# short enough for many samples in 1.5 s. fp32 256^3 is ~34 MFLOP: under a ms on one modern core
# (~100 GFLOP/s), a few ms on older ones; thousands of samples in 2 s either way.
DEFAULTS = {"cuda": {"size": 8192, "seconds": 1.5, "dtype": torch.bfloat16},
            "cpu": {"size": 256, "seconds": 2.0, "dtype": torch.float32}}
# Queue this many matmuls between synchronisations: the GPU never idles waiting for the host, and
# the clock is read only once the queued work is done, so the count is honest.
_CUDA_CHUNK = 4



def cpu_threads() -> int:
    """Threads for this rank's CPU matmuls: OMP_NUM_THREADS when set (torchrun sets 1 when several
    ranks share a node), else the node's cores shared among its ranks, so ranks don't
    oversubscribe the cores and time each other's contention."""
    try:
        threads = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        threads = 0
    if threads > 0:
        return threads
    local_world = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, (os.cpu_count() or 1) // local_world)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_matmuls(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, seconds: float) -> tuple[int, float]:
    """(matmuls done, seconds taken) running ``a @ b`` into ``out`` for at least ``seconds``."""
    device = a.device
    chunk = _CUDA_CHUNK if device.type == "cuda" else 1
    count = 0
    _sync(device)
    started = time.perf_counter()
    while True:
        for _ in range(chunk):
            torch.mm(a, b, out=out)
        count += chunk
        _sync(device)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return count, elapsed


def node_rank(rank: int) -> int | str:
    """This node's index: fsdpctl's own FSDPCTL_NODE_RANK, else torchrun's GROUP_RANK, else a guess
    from the rank (nodes with equal rank counts)."""
    for name in ("FSDPCTL_NODE_RANK", "GROUP_RANK"):
        value = os.environ.get(name, "")
        if value:
            return int(value) if value.isdigit() else value
    return rank // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def measure(device: torch.device, size: int, seconds: float, dtype: torch.dtype) -> dict:
    """This rank's figures: warm-up, a barrier so all ranks start together, then the timed run."""
    generator = torch.Generator(device=device).manual_seed(dist.get_rank())
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    out = torch.empty(size, size, device=device, dtype=dtype)
    # The warm-up picks the kernels and lets GPU clocks ramp before anything is counted.
    time_matmuls(a, b, out, min(0.5, seconds / 4))
    dist.barrier()
    count, elapsed = time_matmuls(a, b, out, seconds)
    flops = 2.0 * size ** 3 * count / elapsed
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    return {"rank": dist.get_rank(), "local_rank": local_rank, "node": node_rank(dist.get_rank()),
            "host": os.environ.get("FSDPCTL_HOST") or socket.gethostname(),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "tflops": round(flops / 1e12, 6), "gflops": round(flops / 1e9, 3),
            "matmuls": count, "seconds": round(elapsed, 6)}


def _fail(rank: int, message: str) -> None:
    if rank == 0:
        print(f"{PREFIX}: {message}", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    os._exit(2)


@record
def main(argv: list[str] | None = None) -> None:
    """Run the check on this rank; global rank 0 prints the ``fsdpctl.compute: {json}`` line."""
    parser = argparse.ArgumentParser(prog="python -m fsdpctl.workload.compute_check", description=__doc__)
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--size", type=int, default=0, help="matrix side (default: 8192 on GPU, 256 on CPU)")
    parser.add_argument("--seconds", type=float, default=0.0, help="timed run (default: 1.5 on GPU, 2 on CPU)")
    args, _ = parser.parse_known_args(argv)  # the launcher may pass training flags too: ignored here
    device = join_group(args.device)
    use_cuda = device.type == "cuda"
    if not use_cuda:
        torch.set_num_threads(cpu_threads())
    defaults = DEFAULTS[device.type]
    rank = dist.get_rank()
    size, seconds = args.size or defaults["size"], args.seconds or defaults["seconds"]
    if size <= 0 or seconds <= 0:
        _fail(rank, f"--size and --seconds must be positive (got {size}, {seconds})")
    mine = measure(device, size, seconds, defaults["dtype"])
    ranks: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    finish(PREFIX, rank, {"backend": "nccl" if use_cuda else "gloo", "device": device.type,
                          "dtype": str(defaults["dtype"]).removeprefix("torch."), "size": size, "seconds": seconds,
                          "ranks": sorted(ranks, key=lambda r: r["rank"])})


if __name__ == "__main__":
    main()
