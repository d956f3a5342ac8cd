"""fsdpctl's start-up hook for every rank it starts: first on the ranks' PYTHONPATH, so Python runs it
as ``sitecustomize`` before the rank's own code (the bundled workload or the user's program alike).

- A crash (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL) prints every thread's Python stack to stderr,
  which torchrun prefixes with the rank: the failure summary shows where it died, not only "-11".
- ``DUMP_SIGNAL`` (a real-time signal; never SIGUSR2, which Slurm's requeue uses, nor SIGTERM) appends
  every thread's Python stack to ``$FSDPCTL_RUN_DIR/stacks/rank<RANK>.txt``. The dump is written by
  the signal handler itself, so a rank stuck in C code (a collective, a lock) still answers; a process
  without the handler is never sent the signal (``fsdpctl.node.stacks`` reads SigCgt first).
- A thread waits on ``$FSDPCTL_RUN_DIR/flight/rank<RANK>.trigger`` (a FIFO): whatever is written there
  makes it dump torch's flight recorder (the last collectives of each process group, NCCL's and the
  CPU backends') under ``$FSDPCTL_RUN_DIR/flight/<kind>/rank_<RANK>``.

- Once ``torch`` is imported (in torchrun's agent, in a rank, in a worker it spawns), the objects that
  exist then are frozen (``gc.freeze``): torch's hundred-thousand-odd import-time objects leave the
  collector's view. Each full collection of the run is then cheaper, and so is the interpreter's
  last one at exit: 0.6 s of CPU per process, 0.1-0.25 s frozen. That last one is what 15 ranks and
  16 agents spend together when one rank of a 16-node run dies. Objects made after the import,
  the user's own among them, are collected as before. ``FSDPCTL_GC_FREEZE=0`` leaves the collector
  alone.

Only the process torchrun started for a rank sets the dumps up (not its children, which inherit the
environment). Any other ``sitecustomize`` further on the path is run afterwards, as if this one were
not there. Standard library only; nothing here imports torch.
"""

import faulthandler
import gc
import os
import signal
import sys
import threading

DUMP_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None
OWNER_VARIABLE = "FSDPCTL_RANK_HOOK_PID"
RANKS_LINE = "fsdpctl: global "
"""How local rank 0's line naming its node's global ranks starts: ``rank 3`` or ``ranks 8-15`` follows
(``fsdpctl.rundir.lines`` reads it)."""
FLIGHT_KINDS = (("nccl", "_dump_nccl_trace"), ("cpu", "_dump_fr_trace"))


def _flight_dumps(rank):
    """Dump every flight recorder torch has in this process; the files written."""
    c10d = sys.modules.get("torch._C._distributed_c10d")
    written = []
    if c10d is None:  # torch.distributed never started here: nothing recorded
        return written
    flight = os.path.join(os.environ["FSDPCTL_RUN_DIR"], "flight")
    for kind, name in FLIGHT_KINDS:
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            data = dump()
        except Exception as exc:  # noqa: BLE001 - a dump that fails must not end the rank
            data = None
            sys.stderr.write(f"fsdpctl: flight recorder ({kind}) dump failed: {exc}\n")
        if not data:
            continue
        folder = os.path.join(flight, kind)
        os.makedirs(folder, exist_ok=True)
        target = os.path.join(folder, f"rank_{rank}")
        with open(target + ".tmp", "wb") as handle:
            handle.write(data)
        os.replace(target + ".tmp", target)  # a reader never sees half a dump
        written.append(target)
    return written


def _serve_flight_dumps(trigger, rank):
    while True:
        try:
            with open(trigger, "rb") as fifo:  # blocks (GIL released) until fsdpctl writes
                fifo.read()
            _flight_dumps(rank)
            with open(trigger + ".done", "w") as done:  # tells the gatherer the dump is complete
                done.write("1\n")
        except OSError:
            return


def _say_ranks(rank):
    """Local rank 0 names the global ranks its node holds: torchrun's rendezvous decides them (c10d
    sorts the nodes by address), and ``status`` shows the map from this line."""
    if os.environ.get("LOCAL_RANK") != "0" or not os.environ.get("LOCAL_WORLD_SIZE", "").isdigit():
        return
    first, count = int(rank), int(os.environ["LOCAL_WORLD_SIZE"])
    ranks = f"ranks {first}-{first + count - 1}" if count > 1 else f"rank {first}"
    sys.stderr.write(f"{RANKS_LINE}{ranks} on node {os.environ.get('FSDPCTL_NODE_RANK', '?')} "
                     f"(torchrun group rank {os.environ.get('GROUP_RANK', '?')})\n")
    sys.stderr.flush()


def _install():
    faulthandler.enable(all_threads=True)
    rank, run_dir = os.environ.get("RANK"), os.environ.get("FSDPCTL_RUN_DIR")
    if rank is None or not run_dir or not rank.isdigit():
        return
    owner = os.environ.get(OWNER_VARIABLE)
    if owner and owner != str(os.getpid()):
        return  # a child of the rank (a data loader, a compile worker): the rank's files are the rank's
    os.environ[OWNER_VARIABLE] = str(os.getpid())
    _say_ranks(rank)
    if DUMP_SIGNAL is None:
        return
    stacks = os.path.join(run_dir, "stacks")
    os.makedirs(stacks, exist_ok=True)
    # Kept open for the life of the process: the handler writes to its descriptor.
    handle = open(os.path.join(stacks, f"rank{rank}.txt"), "a")  # noqa: SIM115
    faulthandler.register(DUMP_SIGNAL, file=handle, all_threads=True, chain=False)
    flight = os.path.join(run_dir, "flight")
    os.makedirs(os.path.join(flight, "on-timeout"), exist_ok=True)  # torch's NCCL dumps on a timeout
    trigger = os.path.join(flight, f"rank{rank}.trigger")
    try:
        if os.path.exists(trigger):
            os.unlink(trigger)  # a restarted rank's old pipe has no reader
        os.mkfifo(trigger, 0o600)
    except OSError:
        return
    threading.Thread(target=_serve_flight_dumps, args=(trigger, rank), name="fsdpctl-flight-recorder",
                     daemon=True).start()


class _FreezeAfterImport:
    """A finder that answers for ``torch`` alone, once: the real spec, whose module freezes the
    collector's objects as soon as its own code has run, then is given its own loader back."""

    def __init__(self, name):
        self.name = name

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _FreezingLoader(spec.loader)
        return spec


class _FreezingLoader:
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        gc.freeze()


def _freeze_after_torch():
    if os.environ.get("FSDPCTL_GC_FREEZE", "1") != "0" and "torch" not in sys.modules:
        sys.meta_path.insert(0, _FreezeAfterImport("torch"))


def _chain():
    """Run the next ``sitecustomize`` on the path, which this one hides."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    _freeze_after_torch()
    try:
        _install()
    except Exception as exc:  # noqa: BLE001 - a rank must start even where the hook cannot be set up
        sys.stderr.write(f"fsdpctl: the rank's stack-dump hook is off: {exc}\n")
    _chain()
