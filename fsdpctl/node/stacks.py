"""Every rank's stack on this node, as one JSON line between ``BEGIN`` and ``END`` (``answer_of``
reads it back): ``python -m fsdpctl.node.stacks RUN_ID RUN_DIR [--flight] [--no-py-spy]``.

A rank is a process whose environment carries ``FSDPCTL_RUN_ID=RUN_ID`` and a ``RANK`` its parent
does not share (a rank's own children, data loaders and compile workers, inherit both). For each,
in parallel: ``py-spy dump --json`` where this node has py-spy (``--native``: C/C++ frames too,
else without them if that fails), else the rank's own dump handler (``fsdpctl.node.startup``), which writes
every thread's Python stack when sent ``DUMP_SIGNAL``; a process that has not installed it is
never sent the signal. With ``--flight`` each rank is also asked for its flight-recorder dump.

Threads come back as ``{"name", "main", "frames": [{"function", "file", "line"}]}``, innermost
frame first, whichever way they were read. Standard library only, Python 3.8+.
"""

import argparse
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from .startup.sitecustomize import DUMP_SIGNAL

BEGIN, END = "<<<FSDPCTL-STACKS-BEGIN>>>", "<<<FSDPCTL-STACKS-END>>>"
_HOOK_FILE = os.path.join("fsdpctl", "node", "startup", "sitecustomize.py")  # its own thread: not the rank's
DUMP_WAIT_SECONDS = 5.0
PY_SPY_TIMEOUT = 20.0
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-f]+)")


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def find_ranks(run_id, node_rank=None):
    """{pid: environment} of the run's ranks on this node (those of node ``node_rank``, where given:
    hosts that share one process table, as containers on one machine do, see each other's ranks)."""
    run_processes = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            env = _environ(int(entry))
            if env.get("FSDPCTL_RUN_ID") == run_id and (node_rank is None
                                                         or env.get("FSDPCTL_NODE_RANK") == str(node_rank)):
                run_processes[int(entry)] = env
    ranks = {}
    for pid, env in run_processes.items():
        if "RANK" not in env:
            continue
        parent = run_processes.get(_parent(pid), {})
        if parent.get("RANK") != env["RANK"]:
            ranks[pid] = env
    return ranks


def py_spy_path(python=sys.executable):
    """py-spy on this node: next to its Python (a venv), or on the PATH."""
    beside = os.path.join(os.path.dirname(python), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("py-spy")


def _catches(pid, signum):
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def parse_faulthandler(text):
    """faulthandler's dump as threads (innermost frame first); the main thread is the one whose
    outermost frame is not threading's bootstrap."""
    threads, current = [], None
    for line in text.splitlines():
        if match := _THREAD.match(line):
            current = {"name": ("current " if match["current"].startswith("Current") else "") + match["id"],
                       "frames": []}
            threads.append(current)
        elif (match := _FRAME.match(line)) and current is not None:
            current["frames"].append({"function": match["function"], "file": match["file"],
                                      "line": int(match["line"])})
    for thread in threads:
        outer = thread["frames"][-1] if thread["frames"] else None
        thread["main"] = bool(outer) and not (outer["function"] == "_bootstrap"
                                              and outer["file"].endswith("threading.py"))
    return threads


def parse_py_spy(dump):
    """``py-spy dump --json`` as threads (innermost frame first, native ones marked)."""
    threads = []
    for thread in dump:
        frames = []
        for frame in thread.get("frames", []):
            native = not str(frame.get("filename", "")).endswith(".py")
            frames.append({"function": frame.get("name", "?"), "file": frame.get("filename", "?"),
                           "line": int(frame.get("line") or 0), **({"native": True} if native else {})})
        threads.append({"name": thread.get("thread_name") or str(thread.get("os_thread_id")),
                        "main": thread.get("thread_name") == "MainThread", "frames": frames})
    return threads


def _by_py_spy(py_spy, pid, native):
    errors = []
    for extra in (["--native"], []) if native else ([],):
        try:
            done = subprocess.run([py_spy, "dump", "--pid", str(pid), "--json", "--full-filenames", *extra],
                                  capture_output=True, text=True, timeout=PY_SPY_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
            continue
        if done.returncode == 0:
            try:
                return parse_py_spy(json.loads(done.stdout)), "py-spy" + (" --native" if extra else ""), None
            except ValueError as exc:
                errors.append(f"unreadable output: {exc}")
                continue
        errors.append((done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0])
    return None, "py-spy", "; ".join(errors)


def _by_signal(pid, rank, run_dir):
    if DUMP_SIGNAL is None or not _catches(pid, DUMP_SIGNAL):
        return None, "faulthandler", "no stack-dump handler in this process (started without fsdpctl's hook?)"
    path = os.path.join(run_dir, "stacks", f"rank{rank}.txt")
    start = os.path.getsize(path) if os.path.exists(path) else 0
    try:
        os.kill(pid, DUMP_SIGNAL)
    except OSError as exc:
        return None, "faulthandler", str(exc)
    deadline, size, stable_since = time.monotonic() + DUMP_WAIT_SECONDS, start, None
    while time.monotonic() < deadline:
        now = os.path.getsize(path) if os.path.exists(path) else 0
        if now > start and now == size:
            if stable_since is not None and time.monotonic() - stable_since >= 0.05:
                break
            stable_since = stable_since or time.monotonic()
        else:
            size, stable_since = now, None
        time.sleep(0.01)
    with open(path, "rb") as handle:
        handle.seek(start)
        text = handle.read().decode("utf-8", "replace")
    if not text:
        return None, "faulthandler", f"no dump within {DUMP_WAIT_SECONDS:g} s"
    return parse_faulthandler(text), "faulthandler", None


PIPE_PATIENCE_S = 3.0


def write_pipe(path, data, patience_s=PIPE_PATIENCE_S):
    """``data`` into a rank's pipe (its start-up hook's thread reads it); None, or why not. A signal to
    the rank (a stop, a profiler's timer) takes that reader out of ``open`` for a moment, which the
    writer sees as ENXIO: tried again for ``patience_s``. Past it, nobody reads (no hook, or gone)."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            return exc.strerror
        with os.fdopen(fd, "wb") as fifo:
            fifo.write(data)
        return None


def _flight(rank, run_dir):
    trigger = os.path.join(run_dir, "flight", f"rank{rank}.trigger")
    done = trigger + ".done"
    if os.path.exists(done):
        os.unlink(done)
    error = write_pipe(trigger, b"dump\n")
    if error is not None:
        return f"no flight-recorder trigger: {error}"
    deadline = time.monotonic() + DUMP_WAIT_SECONDS
    while time.monotonic() < deadline and not os.path.exists(done):
        time.sleep(0.02)
    return None if os.path.exists(done) else f"no flight-recorder dump within {DUMP_WAIT_SECONDS:g} s"


def one_rank(pid, env, run_dir, py_spy, flight, native=False):
    rank = env["RANK"]
    threads, method, error = (None, None, None)
    if py_spy:
        threads, method, error = _by_py_spy(py_spy, pid, native)
    if threads is None:
        threads, fallback, why = _by_signal(pid, rank, run_dir)
        method, error = (fallback, None) if threads is not None else (method or fallback,
                                                                       "; ".join(e for e in (error, why) if e))
    threads = [t for t in threads or [] if not any(f["file"].endswith(_HOOK_FILE) for f in t["frames"])]
    found = {"rank": int(rank), "local_rank": int(env.get("LOCAL_RANK", -1)), "pid": pid, "method": method,
             "threads": threads, "error": error}
    if flight:
        found["flight_error"] = _flight(rank, run_dir)
    return found


def gather(run_id, run_dir, use_py_spy=True, flight=False, node_rank=None, native=False):
    ranks = find_ranks(run_id, node_rank)
    py_spy = py_spy_path() if use_py_spy else None
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(ranks)))) as pool:
        found = list(pool.map(lambda item: one_rank(item[0], item[1], run_dir, py_spy, flight, native),
                              ranks.items()))
    flight_files = []
    if flight:
        for root, _, files in os.walk(os.path.join(run_dir, "flight")):
            flight_files += [os.path.join(root, f) for f in files if f.startswith("rank_")]
    return {"host": socket.gethostname(), "py_spy": py_spy, "ranks": sorted(found, key=lambda r: r["rank"]),
            "flight_files": sorted(flight_files), "node_rank": node_rank}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fsdpctl.node.stacks")
    parser.add_argument("run_id")
    parser.add_argument("run_dir")
    parser.add_argument("--no-py-spy", action="store_true")
    parser.add_argument("--flight", action="store_true")
    parser.add_argument("--native", action="store_true", help="py-spy's C/C++ frames too")
    parser.add_argument("--node-rank", type=int, default=None, help="only the ranks of this node of the run")
    args = parser.parse_args(argv)
    result = gather(args.run_id, os.path.expanduser(args.run_dir), not args.no_py_spy, args.flight, args.node_rank,
                    args.native)
    sys.stdout.write(BEGIN + json.dumps(result) + END + "\n")  # one write, one line (JSON escapes newlines)
    sys.stdout.flush()


def answer_of(output, begin=BEGIN, end=END, what="the stack reader"):
    """The node's answer between ``begin`` and ``end`` in a command's output (whatever a login shell
    printed around it); raises ValueError when there is none."""
    start = output.rfind(begin)
    stop = output.find(end, start + 1) if start >= 0 else -1
    if stop < 0:
        raise ValueError(f"no answer from {what}")
    return json.loads(output[start + len(begin):stop])


if __name__ == "__main__":
    main()
