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

Only the process torchrun started for a rank sets these up (not its children, which inherit the
environment). Any other ``sitecustomize`` further on the path is run afterwards, as if this one were
not there. Standard library only; nothing here imports torch.
"""

import faulthandler
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
    try:
        _install()
    except Exception as exc:  # noqa: BLE001 - a rank must start even where the hook cannot be set up
        sys.stderr.write(f"fsdpctl: the rank's stack-dump hook is off: {exc}\n")
    _chain()
