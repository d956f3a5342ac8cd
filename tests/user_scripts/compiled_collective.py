"""A user's script with nothing of fsdpctl in it that leans on torch's own behaviour where a start-up
hook could change it, printing what it finds so that two launchers' outputs can be compared:

1. its own wrapper of ``dist.all_reduce``, set after ``import torch`` and before anything imports
   dynamo (as a profiler or a framework does), must stay in place and count its calls once dynamo
   comes in;
2. torch's documented pattern for a traceable collective: ``dist.all_reduce`` inside a function
   compiled with ``fullgraph=True``, in a training loop whose optimizer steps eagerly;
3. the names of a collective stay one function (``dist.all_reduce is c10d.all_reduce``).

    torchrun --nproc-per-node 2 compiled_collective.py
"""

import functools
import sys

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


def say(text):
    sys.stdout.write(text + "\n")  # one write: the ranks' lines do not interleave on a shared stdout
    sys.stdout.flush()


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
say(f"rank {rank} names are one function: {dist.all_reduce is c10d.all_reduce}")

# 1. a wrapper of the program's own, then dynamo imported by the first torch.compile
calls = []
before = dist.all_reduce


@functools.wraps(before)
def counting_all_reduce(*args, **kwargs):
    calls.append(1)
    return before(*args, **kwargs)


dist.all_reduce = counting_all_reduce
torch.compile(lambda x: x * 2)(torch.ones(2))
dist.all_reduce(torch.ones(1))
say(f"rank {rank} own wrapper: {len(calls)} call(s), still in place: {dist.all_reduce is counting_all_reduce}")
dist.all_reduce = before  # the program takes its wrapper off again


# 2. a collective inside a fullgraph-compiled function, each step
@torch.compile(fullgraph=True)
def reduce_mean(x):
    y = x * 1.0
    dist.all_reduce(y)
    return y / dist.get_world_size()


torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 7):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * world + rank))
    loss = model(x).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    mean = reduce_mean(loss.detach().reshape(1))
    say(f"rank {rank} step {step} loss {loss.item():.6f} mean {mean.item():.6f}")

from torch._dynamo.utils import counters  # noqa: E402 - what dynamo did, counted after the fact

say(f"rank {rank} graphs {counters['stats']['unique_graphs']} breaks {sum(counters['graph_break'].values())}")
dist.destroy_process_group()
