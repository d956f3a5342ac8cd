"""A rank's ``torch.profiler`` trace of chosen steps, asked for while the run goes on (``fsdpctl profile``)
or from its start (``launch --profile-steps A-B``), with no line of the program's own.

How a request arrives: ``fsdpctl.node.profile_request`` writes ``profile {json}`` into the rank's
control pipe, which the start-up hook's thread reads (``fsdpctl.node.startup``) and hands to
``request``; ``FSDPCTL_PROFILE_STEPS`` arms the same at import. The request names a step ``start``
that every chosen rank shares and a count ``steps``: the profiler starts as step ``start - 1``
ends and stops as step ``start + steps - 1`` ends, on the training thread, so every rank records the
same steps whole. Whoever counts the steps calls ``step_ended(number)`` at each step's end: the
rank telemetry's step tracker for a user's program, the bundled workload's loop for its own. While
nothing is asked that call is one test of a global.

What it writes under ``$FSDPCTL_RUN_DIR/profile/<id>/``: ``rank<R>.json.gz``, the Chrome trace as
torch exports it, gzipped (cut to ``max_mb`` where it is larger: its earliest events kept), and
``status/rank<R>.json``, what happened: ``done`` (with each step's start and end in ns of this node's
clock, and the unprofiled steps' time before it), ``missed`` (the request came after its start step),
``refused`` (the program runs its own profiler: two cannot run at once), ``ended`` (the program ended
first) or ``failed`` (an error of ours, a full disk among them). The export, gzip and cut run on a
thread of their own after the last profiled step, so the program's steps wait for none of it.

It fails open: nothing here raises into the program; an error ends the profile with a ``failed``
status and one line on stderr. Standard library at import; torch only once a profile starts.
"""

import atexit
import gzip
import json
import os
import sys
import threading
import time

PROFILE_DIR = "profile"
STEPS_VARIABLE = "FSDPCTL_PROFILE_STEPS"
"""``A-B``: profile steps A to B from the start (``launch --profile-steps``)."""
RANKS_VARIABLE = "FSDPCTL_PROFILE_RANKS"
"""Which ranks take ``FSDPCTL_PROFILE_STEPS``: ``all``, a comma list, or ``auto`` (all up to
``AUTO_ALL`` ranks, else the first, middle and last)."""
OPTIONS_VARIABLE = "FSDPCTL_PROFILE_OPTIONS"
"""JSON of the request's other fields (``shapes``, ``stack``, ``max_mb``) for ``FSDPCTL_PROFILE_STEPS``."""
AUTO_ALL = 8
DEFAULT_MAX_MB = 100.0
"""A trace's cap, gzipped."""
MAX_STEPS = 100
EXIT_WAIT_S = 60.0
"""At the program's end, how long a trace still being written is waited for."""


def _say(line):
    try:
        sys.stderr.write(f"fsdpctl: profile: {line}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110 - a closed stderr: the status file says it anyway
        pass


def _rank():
    return int(os.environ.get("RANK", "0") or 0)


def folder(run_dir, profile_id):
    """Where one profile's files go on a node."""
    return os.path.join(run_dir, PROFILE_DIR, profile_id)


def status_path(run_dir, profile_id, rank):
    return os.path.join(folder(run_dir, profile_id), "status", f"rank{rank}.json")


def write_json(path, data):
    """``data`` into ``path`` whole (a reader never sees half of it)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


def chosen(spec, rank, world):
    """Whether ``rank`` (of ``world``) is among ``spec``'s ranks (see ``RANKS_VARIABLE``)."""
    spec = (spec or "auto").strip()
    if spec == "all":
        return True
    if spec == "auto":
        return world <= AUTO_ALL or rank in (0, world // 2, world - 1)
    return str(rank) in {part.strip() for part in spec.split(",")}


def parse_request(text):
    """A request's fields checked: ``id`` (a plain name), ``start`` >= 1, 1 <= ``steps`` <= ``MAX_STEPS``;
    ValueError naming what is wrong."""
    request = json.loads(text)
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    ident = str(request.get("id", ""))
    if not ident or not all(c.isalnum() or c in "-_." for c in ident) or ident.startswith("."):
        raise ValueError(f"id {ident!r} is not a plain name")
    start, steps = request.get("start"), request.get("steps")
    if not isinstance(start, int) or start < 1:
        raise ValueError(f"start {start!r} is not a step number")
    if not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise ValueError(f"steps {steps!r} is not 1-{MAX_STEPS}")
    return request


class Session:
    """One profile of this rank: waiting for its start step, recording, then written."""

    def __init__(self, request, run_dir, rank):
        self.request, self.run_dir, self.rank = request, run_dir, rank
        self.id, self.start, self.steps = request["id"], request["start"], request["steps"]
        self.last = self.start + self.steps - 1
        self.state = "waiting"
        self.profiler = None
        self.began_ns = None
        self.boundaries = []  # (step, begin ns, end ns) of each profiled step
        self.before = []  # seconds of the unprofiled steps seen while waiting
        self.last_end_ns = None
        self.arrived_step = None
        self.writer = None

    # ---- on the training thread ---------------------------------------------------------------------
    def step_ended(self, number):
        now = time.time_ns()
        if self.arrived_step is None:
            self.arrived_step = number
        if self.state == "waiting":
            if number >= self.start:
                self._end("missed", f"the request reached this rank at step {number}, after its start step "
                                    f"{self.start}", at_step=number)
            elif number == self.start - 1:
                self._begin(now)
            elif self.last_end_ns is not None:
                self.before.append((now - self.last_end_ns) / 1e9)
        elif self.state == "recording":
            self.boundaries.append((number, self.last_end_ns, now))
            if number >= self.last:
                self._stop()
        self.last_end_ns = now

    def _begin(self, now):
        try:
            import torch

            if _profiler_running(torch):
                self._end("refused", "the program runs its own torch profiler, and two cannot run at once")
                return
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities,
                                                   record_shapes=bool(self.request.get("shapes")),
                                                   with_stack=bool(self.request.get("stack")))
            self.profiler.start()
            self.began_ns = time.time_ns()
            self.state = "recording"
        except Exception as exc:  # noqa: BLE001 - the program goes on unprofiled
            self._end("failed", f"the profiler did not start: {type(exc).__name__}: {exc}")

    def _stop(self):
        try:
            self.profiler.stop()
        except Exception as exc:  # noqa: BLE001
            self._end("failed", f"the profiler did not stop: {type(exc).__name__}: {exc}")
            return
        self.state = "writing"
        self.writer = threading.Thread(target=self._write, name="fsdpctl-profile-export", daemon=True)
        self.writer.start()

    # ---- after it --------------------------------------------------------------------------------
    def _write(self):
        target = os.path.join(folder(self.run_dir, self.id), f"rank{self.rank}.json.gz")
        raw = target[:-3] + ".tmp"
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            self.profiler.export_chrome_trace(raw)
            with open(raw, "rb") as handle:
                text = handle.read()
            cut = None
            limit = int(float(self.request.get("max_mb") or DEFAULT_MAX_MB) * 2**20)
            packed = gzip.compress(text, 6)
            if len(packed) > limit:
                packed, cut = _cut(text, limit)
            with open(target + ".tmp", "wb") as handle:
                handle.write(packed)
            os.replace(target + ".tmp", target)
            self._end("done", None, trace=os.path.basename(target), bytes=len(packed), raw_bytes=len(text), cut=cut)
        except Exception as exc:  # noqa: BLE001 - a full disk among them
            self._end("failed", f"the trace was not written: {type(exc).__name__}: {exc}")
        finally:
            try:
                os.unlink(raw)
            except OSError:
                pass

    def _end(self, state, why, **extra):
        global _SESSION
        self.state = state
        if _SESSION is self:
            _SESSION = None
        status = {"id": self.id, "rank": self.rank, "state": state, "why": why, "start": self.start,
                  "steps": self.steps, "host": os.environ.get("FSDPCTL_HOST") or os.uname().nodename,
                  "node": os.environ.get("FSDPCTL_NODE_RANK") or os.environ.get("GROUP_RANK"),
                  "local_rank": int(os.environ.get("LOCAL_RANK", "0") or 0), "pid": os.getpid(),
                  "clock_ns": time.time_ns(), "began_ns": self.began_ns,
                  "step_times": [{"step": s, "begin_ns": b, "end_ns": e} for s, b, e in self.boundaries],
                  "unprofiled_step_s": sorted(self.before)[len(self.before) // 2] if self.before else None,
                  "arrived_at_step": self.arrived_step, **extra}
        if why:
            _say(f"rank {self.rank}: {state}: {why}")
        try:
            write_json(status_path(self.run_dir, self.id, self.rank), status)
        except Exception as exc:  # noqa: BLE001 - a full disk: the launcher says it got no answer
            _say(f"rank {self.rank}: its status could not be written ({type(exc).__name__}: {exc})")

    def program_ends(self):
        if self.state == "writing" and self.writer is not None:
            self.writer.join(EXIT_WAIT_S)  # the trace is the point of the run: it is given time to land
        elif self.state in ("waiting", "recording"):
            if self.profiler is not None:
                try:
                    self.profiler.stop()
                except Exception:  # noqa: BLE001, S110 - it is leaving anyway
                    pass
            self._end("ended", f"the program ended at step {self.last_step()} before the profile's last step "
                               f"{self.last}")

    def last_step(self):
        return self.boundaries[-1][0] if self.boundaries else (self.start - 1 if self.began_ns else "?")


def _profiler_running(torch):
    """Whether a profiler of the program's own records now (kineto's, or the legacy autograd one)."""
    enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
    return bool(enabled()) if enabled is not None else bool(torch.autograd.profiler._is_profiler_enabled)


def _cut(text, limit):
    """The trace's earliest events that fit in ``limit`` bytes gzipped, and what was cut."""
    trace = json.loads(text)
    events = trace.get("traceEvents") or []
    meta = [e for e in events if e.get("ph") == "M"]
    timed = sorted((e for e in events if e.get("ph") != "M"), key=lambda e: e.get("ts", 0))
    keep = len(timed)
    while keep > 1:
        keep //= 2
        trace["traceEvents"] = meta + timed[:keep]
        packed = gzip.compress(json.dumps(trace).encode(), 6)
        if len(packed) <= limit:
            last = timed[keep - 1].get("ts") if keep else None
            return packed, {"events_kept": keep, "events": len(timed), "until_ts": last}
    trace["traceEvents"] = meta
    return gzip.compress(json.dumps(trace).encode(), 6), {"events_kept": 0, "events": len(timed), "until_ts": None}


_SESSION = None
_LOCK = threading.Lock()


def step_ended(number):
    """Step ``number`` of this rank just ended (called on the training thread at every step's end)."""
    session = _SESSION
    if session is None:
        return
    try:
        session.step_ended(number)
    except Exception as exc:  # noqa: BLE001 - the program's step goes on
        session._end("failed", f"{type(exc).__name__}: {exc}")


def request(text):
    """A request read from the control pipe (``{json}``): armed for this rank, replacing one that waits.
    One that records keeps on, and the new one is answered ``busy``."""
    global _SESSION
    run_dir = os.environ.get("FSDPCTL_RUN_DIR")
    if not run_dir:
        return
    rank = _rank()
    try:
        asked = parse_request(text)
    except (ValueError, TypeError) as exc:
        _say(f"rank {rank}: a request that cannot be read ({exc})")
        return
    with _LOCK:
        current = _SESSION
        if current is not None and current.state in ("recording", "writing"):
            Session(asked, run_dir, rank)._end("busy", f"profile {current.id} is being recorded on this rank")
            return
        _SESSION = Session(asked, run_dir, rank)


def _from_environment():
    """``launch --profile-steps A-B`` arms this rank at import, where its ranks choose it."""
    steps, run_dir = os.environ.get(STEPS_VARIABLE, ""), os.environ.get("FSDPCTL_RUN_DIR")
    if not steps or not run_dir or "RANK" not in os.environ:
        return
    if not chosen(os.environ.get(RANKS_VARIABLE), _rank(), int(os.environ.get("WORLD_SIZE", "1") or 1)):
        return
    try:
        first, _, last = steps.partition("-")
        first, last = int(first), int(last or first)
        options = json.loads(os.environ.get(OPTIONS_VARIABLE) or "{}")
        attempt = os.environ.get("FSDPCTL_ATTEMPT", "1")
        request(json.dumps({**options, "id": f"launch-attempt{attempt}", "start": first, "steps": last - first + 1}))
    except (ValueError, TypeError) as exc:
        _say(f"{STEPS_VARIABLE}={steps!r} cannot be read ({exc}); no profile")


def _at_exit(pid):
    session = _SESSION
    if session is not None and os.getpid() == pid:
        try:
            session.program_ends()
        except Exception:  # noqa: BLE001, S110 - the program is leaving
            pass


_from_environment()
atexit.register(_at_exit, os.getpid())
