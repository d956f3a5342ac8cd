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
  CPU backends') under ``$FSDPCTL_RUN_DIR/flight/<kind>/rank_<RANK>``. What starts with ``profile ``
  is a profile request instead (``fsdpctl.node.profiling``).

- Once ``torch`` is imported (in torchrun's agent, in a rank, in a worker it spawns), the objects that
  exist then are frozen (``gc.freeze``): torch's hundred-thousand-odd import-time objects leave the
  collector's view. Each full collection of the run is then cheaper, and so is the interpreter's
  last one at exit: 0.6 s of CPU per process, 0.1-0.25 s frozen. That last one is what 15 ranks and
  16 agents spend together when one rank of a 16-node run dies. Objects made after the import,
  the user's own among them, are collected as before. ``FSDPCTL_GC_FREEZE=0`` leaves the collector
  alone.
- Then, in a rank whose plan asks for it (``FSDPCTL_TELEMETRY=1``: a user's program, not the
  bundled workload, which times itself), ``fsdpctl.node.telemetry`` puts its hooks on torch: every
  rank's steps, loss and times, with no line of the program's own.
- At exit, before the interpreter shuts down, a rank waits (up to
  ``SETTLE_LIMIT_S``) until torch's own threads (``pt_*``: gloo's work loops, NCCL's watchdog, the
  autograd device threads) have stopped running. A collective issued inside ``backward()`` carries
  torch's thread-local state, and with it a Python object (the ``contextvars`` context that
  ``torch.autograd.graph._engine_run_backward`` stashes); the gloo thread that finished it drops that
  object, which takes the GIL. Once the interpreter is finalizing, taking the GIL ends the thread
  with ``pthread_exit``, whose unwinding through a ``noexcept`` destructor aborts the whole process
  ("terminate called without an active exception", SIGABRT) after the program's last line:
  pytorch/pytorch#117762 and #190489. Waiting while the interpreter is still whole lets that thread
  finish its release first; it costs a few milliseconds at a normal exit. Then it leaves
  ``$FSDPCTL_RUN_DIR/exits/rank<RANK>`` (``ENDED_DIR``): a rank that dies by a signal after that
  file was written died in Python's own shutdown, its program over, and fsdpctl says so.

Only the process torchrun started for a rank sets the dumps up (not its children, which inherit the
environment). Any other ``sitecustomize`` further on the path is run afterwards, as if this one were
not there. Standard library only; nothing here imports torch (the telemetry is imported only once the
program itself has imported torch).
"""

import atexit
import faulthandler
import gc
import os
import signal
import sys
import threading
import time

DUMP_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None
OWNER_VARIABLE = "FSDPCTL_RANK_HOOK_PID"
RANKS_LINE = "fsdpctl: global "
"""How local rank 0's line naming its node's global ranks starts: ``rank 3`` or ``ranks 8-15`` follows
(``fsdpctl.rundir.lines`` reads it)."""
PROFILE_MESSAGE = b"profile "
"""What starts a profile request written into a rank's pipe (anything else asks for a flight dump)."""
FLIGHT_KINDS = (("nccl", "_dump_nccl_trace"), ("cpu", "_dump_fr_trace"))
SETTLE_LIMIT_S = 5.0
"""The longest a rank waits at exit for torch's threads to stop running (one that never does: a
collective still in flight) before it lets the interpreter shut down anyway;
``FSDPCTL_EXIT_SETTLE_S`` sets another (0: no wait)."""
ENDED_DIR = "exits"
"""Under the run directory: ``rank<RANK>`` holds ``attempt <N>`` once that rank's program and every
exit handler of it have run (only the interpreter's own shutdown is left)."""
TORCH_THREAD_PREFIX = "pt_"
"""How torch names the threads its C++ side starts (``pt_gloo_runloop``, ``pt_nccl_watchdg``...)."""


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
                said = fifo.read()
            if said.startswith(PROFILE_MESSAGE):
                _profile_request(said[len(PROFILE_MESSAGE):])
                continue
            _flight_dumps(rank)
            with open(trigger + ".done", "w") as done:  # tells the gatherer the dump is complete
                done.write("1\n")
        except OSError:
            return


def _profile_request(text):
    """A profile request (``fsdpctl.node.profiling``), armed for this rank's next steps."""
    try:
        from fsdpctl.node import profiling

        profiling.request(text.decode("utf-8", "replace"))
    except Exception as exc:  # noqa: BLE001 - the rank goes on unprofiled
        _say_off("for a profile request", exc)


def torch_threads(own_tid):
    """(thread id, state letter) of torch's own threads (see ``TORCH_THREAD_PREFIX``) in this
    process, ``own_tid`` aside."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        if tid == own_tid:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                stat = handle.read()
        except OSError:  # the thread ended between the listing and the read
            continue
        name, state = stat[stat.find("(") + 1:stat.rfind(")")], stat[stat.rfind(")") + 2:][:1]
        if name.startswith(TORCH_THREAD_PREFIX):
            found.append((tid, state))
    return found


def torch_threads_running(own_tid):
    """The thread ids of torch's threads that are running, runnable or in an uninterruptible wait."""
    return [tid for tid, state in torch_threads(own_tid) if state in ("R", "D")]


def settle_torch_threads(limit_s=SETTLE_LIMIT_S, quiet_polls=5, poll_s=0.002):
    """Wait, the GIL released, until none of torch's threads has run for ``quiet_polls`` polls in a
    row (or ``limit_s`` passed); the seconds waited. The polls span more than the 5 ms in which a
    thread waiting for the GIL wakes to ask for it again. Does nothing where torch started no thread
    of its own (no process group, no CUDA work)."""
    own, start = str(threading.get_native_id()), time.monotonic()
    if "torch" not in sys.modules or not os.path.isdir("/proc/self/task") or not torch_threads(own):
        return 0.0
    quiet = 0
    while quiet < quiet_polls and time.monotonic() - start < limit_s:
        time.sleep(poll_s)  # a torch thread waiting for the GIL takes it here
        quiet = 0 if torch_threads_running(own) else quiet + 1
    return time.monotonic() - start


def ended_marker(run_dir, rank):
    """The file a rank leaves once its program has ended (see ``ENDED_DIR``)."""
    return os.path.join(run_dir, ENDED_DIR, f"rank{rank}")


def _at_exit(marker, pid):
    """The rank's last exit handler: torch's threads settled, then the program's end recorded."""
    if os.getpid() != pid:
        return  # a child the program forked, exiting through the rank's handlers
    try:
        limit = float(os.environ.get("FSDPCTL_EXIT_SETTLE_S", SETTLE_LIMIT_S))
    except ValueError:
        limit = SETTLE_LIMIT_S
    if limit > 0:
        settle_torch_threads(limit)
    try:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w") as handle:
            handle.write(f"attempt {os.environ.get('FSDPCTL_ATTEMPT', '1')}\n")
    except OSError:
        pass


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
    marker = ended_marker(run_dir, rank)
    try:
        os.unlink(marker)  # an earlier attempt's
    except OSError:
        pass
    # Registered before the program's own handlers (and torch's), so it runs after all of them.
    atexit.register(_at_exit, marker, os.getpid())
    if os.environ.get("FSDPCTL_TELEMETRY") == "1":
        _TELEMETRY.append((run_dir, rank))
    if _TELEMETRY or (rank == "0" and os.environ.get("FSDPCTL_SAY_SAVES") == "1"):  # (SAY_SAVES: an elastic run)
        when_imported("torch.distributed.checkpoint", _time_checkpoints)
        when_imported("torch.distributed.checkpoint.state_dict", _time_checkpoints)
        when_imported("transformers.trainer", _time_trainer)
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


class _AfterImport:
    """A finder that answers for one module alone, once: the real spec, whose loader calls
    ``callback(module)`` as soon as the module's own code has run, then gives the module its own
    loader back."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _CallingBackLoader(spec.loader, self.callback)
        return spec


class _CallingBackLoader:
    def __init__(self, loader, callback):
        self.loader, self.callback = loader, callback

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.callback(module)
        except Exception as exc:  # noqa: BLE001 - the program's import goes on as if fsdpctl were not here
            _say_off(f"after importing {module.__name__}", exc)


def _say_off(where, exc):
    try:
        sys.stderr.write(f"fsdpctl: the start-up hook is off {where} ({type(exc).__name__}: {exc}); "
                         "the program goes on unchanged\n")
    except Exception:  # noqa: BLE001, S110 - a closed stderr
        pass


def when_imported(name, callback):
    """``callback(module)`` once module ``name`` is imported (now, where it already is)."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


def _time_checkpoints(module):
    """``torch.distributed.checkpoint``'s calls timed (``fsdpctl.node.checkpoint_calls``), fail open."""
    try:
        from fsdpctl.node.checkpoint_calls import wrap

        wrap(module, _say_off)
    except Exception as exc:  # noqa: BLE001 - the program's checkpoints as they are
        _say_off("for checkpoint calls", exc)


def _time_trainer(module):
    """The Hugging Face Trainer's saves, loads and evaluations timed, fail open."""
    try:
        from fsdpctl.node.checkpoint_calls import wrap_trainer

        wrap_trainer(module, _say_off)
    except Exception as exc:  # noqa: BLE001 - the program's Trainer as it is
        _say_off("for the Trainer's checkpoints", exc)


_TELEMETRY = []
"""(run directory, rank) of this rank, where its program's telemetry is wanted."""


def _after_torch(torch):
    """Inside the program's ``import torch``, once torch's own code has run: nothing raised here may
    reach that import (``_CallingBackLoader`` says what did, once)."""
    if os.environ.get("FSDPCTL_GC_FREEZE", "1") != "0":
        gc.freeze()
    if not _TELEMETRY:
        return
    try:
        from fsdpctl.node.telemetry import install
    except Exception as exc:  # noqa: BLE001 - an fsdpctl the rank cannot import: torch as it is
        sys.stderr.write(f"fsdpctl: rank telemetry is off for this rank: {exc}\n")
        return
    install(*_TELEMETRY[0], when_imported)


def _watch_for_torch():
    if "torch" not in sys.modules:
        sys.meta_path.insert(0, _AfterImport("torch", _after_torch))


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
    _watch_for_torch()
    try:
        _install()
    except Exception as exc:  # noqa: BLE001 - a rank must start even where the hook cannot be set up
        sys.stderr.write(f"fsdpctl: the rank's stack-dump hook is off: {exc}\n")
    _chain()
