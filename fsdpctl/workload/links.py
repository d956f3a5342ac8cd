"""Node-to-node link bandwidth: every pair of nodes exchanges a buffer both ways, under torchrun.

``python -m fsdpctl.workload.links [--device cpu|cuda] [--bytes 8M] [--iters N] [--per-rank]``
(``fsdpctl doctor --links`` launches it like the training job). One rank per node takes part, its
``LOCAL_RANK`` 0 "leader"; the others only join the barriers. The pairs are measured in rounds of
disjoint pairs (a round-robin tournament), every pair of a round at once, so a round loads each
node's link with exactly one peer and a full schedule takes n-1 rounds (n for an odd n). In a pair
both leaders send and receive ``--bytes`` at the same time: a warm-up exchange, then ``--iters``
timed ones, clocked by the lower node; the bandwidth per direction is bytes * iters / seconds.
Global rank 0 prints one ``fsdpctl.links: {json}`` line; ``fsdpctl.hostcheck.links`` reads it.
``--per-rank`` makes every rank a node of its own, so the program can be tried on one machine.
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

from .collectives import finish, join_group, parse_size
from .link_rule import bandwidths, slow_pairs

PREFIX = "fsdpctl.links"
# Big enough on GPUs to reach a link's streaming rate; small on CPU, where gloo over TCP is slow.
DEFAULTS = {"cuda": ("256M", 10), "cpu": ("8M", 5)}


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``n`` nodes once, in rounds of disjoint pairs (the circle method).

    Node 0 stays put while the others rotate one place a round; position i plays position m-1-i.
    An odd ``n`` gets a dummy node, whose partner sits the round out: n rounds instead of n-1.
    """
    if n < 2:
        return []
    m = n + n % 2
    ring = list(range(1, m))
    schedule = []
    for _ in range(m - 1):
        seats = [0, *ring]
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        schedule.append([(min(a, b), max(a, b)) for a, b in pairs if a < n and b < n])
        ring = ring[-1:] + ring[:-1]
    return schedule


def identity(per_rank: bool, rank: int, local_rank: int) -> dict:
    """What this rank tells the others: its ranks, its node and host, and whether it is a leader."""
    host = os.environ.get("FSDPCTL_HOST") or socket.gethostname()
    if per_rank:
        return {"rank": rank, "local_rank": local_rank, "node_rank": rank, "host": f"{host}/{local_rank}",
                "leader": True}
    node_rank = os.environ.get("FSDPCTL_NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    return {"rank": rank, "local_rank": local_rank, "node_rank": int(node_rank), "host": host,
            "leader": local_rank == 0}


def leaders(everyone: list[dict]) -> list[dict]:
    """The leaders in node order; a node's index in the schedule is its place in this list (so a
    repeated or missing node rank still gives every leader a pair of its own)."""
    return sorted((who for who in everyone if who["leader"]), key=lambda who: (who["node_rank"], who["rank"]))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def exchange(peer: int, send: torch.Tensor, recv: torch.Tensor, use_cuda: bool) -> None:
    """Send ``send`` to ``peer`` while receiving ``recv`` from it, both at once."""
    if use_cuda:
        # NCCL needs the two directions in one batch, or each send waits for its matching receive.
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)])
    else:
        works = [dist.isend(send, peer), dist.irecv(recv, peer)]
    for work in works:
        work.wait()


def measure_pair(peer: int, size: int, iters: int, device: torch.device) -> float:
    """Seconds for ``iters`` two-way exchanges of ``size`` bytes with ``peer``, after a warm-up."""
    send = torch.ones(size, dtype=torch.uint8, device=device)
    recv = torch.empty(size, dtype=torch.uint8, device=device)
    use_cuda = device.type == "cuda"
    # The warm-up also lines the two leaders up: the timed exchanges start together on both sides.
    exchange(peer, send, recv, use_cuda)
    _sync(device)
    started = time.perf_counter()
    for _ in range(iters):
        exchange(peer, send, recv, use_cuda)
    _sync(device)
    return time.perf_counter() - started


def run_rounds(nodes: list[dict], rank: int, size: int, iters: int, device: torch.device) -> list[dict]:
    """Play the schedule; return the pairs this rank clocked (those where it leads the lower node)."""
    mine = []
    for number, pairs in enumerate(rounds(len(nodes))):
        for a, b in pairs:
            if rank in (nodes[a]["rank"], nodes[b]["rank"]):
                peer = nodes[b]["rank"] if rank == nodes[a]["rank"] else nodes[a]["rank"]
                seconds = measure_pair(peer, size, iters, device)
                if rank == nodes[a]["rank"]:
                    mine.append({"a": a, "b": b, "round": number, "seconds": seconds,
                                 "gbps": size * iters / seconds / 1e9})
        # A round ends for everyone at once: no pair of the next round shares a link with a late one.
        dist.barrier()
    return mine


def measure_again(nodes: list[dict], rank: int, suspects: list[tuple[int, int]], size: int, iters: int,
                  device: torch.device) -> list[dict]:
    """Each suspect pair measured again, one pair at a time (nothing else on the links meanwhile);
    the pairs this rank clocked, as ``run_rounds`` returns them."""
    mine = []
    for a, b in suspects:
        if rank in (nodes[a]["rank"], nodes[b]["rank"]):
            peer = nodes[b]["rank"] if rank == nodes[a]["rank"] else nodes[a]["rank"]
            seconds = measure_pair(peer, size, iters, device)
            if rank == nodes[a]["rank"]:
                mine.append({"a": a, "b": b, "seconds": seconds, "gbps": size * iters / seconds / 1e9})
        dist.barrier()
    return mine


def gathered(mine: list[dict], world: int) -> list[dict]:
    clocked: list = [None] * world
    dist.all_gather_object(clocked, mine)
    return [p for part in clocked for p in part]


def _settings(args: argparse.Namespace, device: str) -> tuple[int, int]:
    size_text, iters = DEFAULTS[device]
    size = parse_size(args.bytes or size_text)
    iters = args.iters if args.iters is not None else iters
    if iters < 1:
        raise ValueError(f"--iters {iters}: give at least 1")
    return size, iters


@record
def main(argv: list[str] | None = None) -> None:
    """Measure every node pair's link and print the result on global rank 0."""
    parser = argparse.ArgumentParser(prog="python -m fsdpctl.workload.links", description=__doc__)
    parser.add_argument("--bytes", default="", help="buffer per exchange (default: 256M on GPU, 8M on CPU)")
    parser.add_argument("--iters", type=int, default=None, help="timed exchanges per pair (default: 10 GPU, 5 CPU)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--per-rank", action="store_true", help="every rank is a node of its own (one-machine tests)")
    args, _ = parser.parse_known_args(argv)  # the launcher may pass training flags too: ignored here
    device = join_group(args.device)
    use_cuda, local_rank = device.type == "cuda", int(os.environ.get("LOCAL_RANK", "0"))
    world, rank = dist.get_world_size(), dist.get_rank()
    try:
        size, iters = _settings(args, device.type)
    except ValueError as exc:
        if rank == 0:
            print(f"{PREFIX}: {exc}; write e.g. --bytes 64M --iters 5", file=sys.stderr, flush=True)
        dist.destroy_process_group()
        os._exit(2)
    if use_cuda:
        # NCCL's first operation on a group must involve every rank; the pairs' batches involve two.
        dist.all_reduce(torch.ones(1, device=device))
    everyone: list = [None] * world
    dist.all_gather_object(everyone, identity(args.per_rank, rank, local_rank))
    nodes = leaders(everyone)
    started = time.perf_counter()
    pairs = sorted(gathered(run_rounds(nodes, rank, size, iters, device), world),
                   key=lambda p: (p["round"], p["a"], p["b"]))
    # A pair that reads slow is measured again before anyone is named: one slow reading while the
    # machine or the network is busy for a moment is not a slow link.
    suspects = [(a, b) for a, b, _, _ in slow_pairs(len(nodes), bandwidths(pairs))]
    again = sorted(gathered(measure_again(nodes, rank, suspects, size, iters, device), world),
                   key=lambda p: (p["a"], p["b"])) if suspects else []
    finish(PREFIX, rank, {"backend": "nccl" if use_cuda else "gloo", "device": device.type,
                          "nodes": [{"node": i, "host": who["host"], "rank": who["rank"],
                                     "node_rank": who["node_rank"]} for i, who in enumerate(nodes)],
                          "rounds": len(rounds(len(nodes))), "bytes": size, "iters": iters, "pairs": pairs,
                          "again": again, "seconds": time.perf_counter() - started})


if __name__ == "__main__":
    main()
