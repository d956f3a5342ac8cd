"""One node of the fake backend: it runs the node's ranks as plain processes on this machine, writes
their lines to ``node<R>.log`` as torchrun's ``--tee`` would (``[rank<N>]:`` before each), and ends as
torchrun does: when a rank fails it stops the others, prints torchrun's failure summary naming the
rank and its exit code, and exits 1. ``node<R>.exit`` is written after the log's last byte.

    python -m tests.fakebackend.node '{"run_dir": ..., "node_rank": 0, ...}'
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time


def main(args: dict) -> int:
    run_dir, node, nproc = args["run_dir"], args["node_rank"], args["nproc"]
    log = open(os.path.join(run_dir, f"node{node}.log"), "ab")  # noqa: SIM115 - closed at the end
    lock = threading.Lock()

    def write(data: bytes) -> None:
        with lock:
            log.write(data)
            log.flush()

    write(f"fsdpctl: node {node} of {args['num_nodes']} on {args['host']} in {run_dir}\n".encode())
    cwd = os.path.join(run_dir, args["chdir"]) if not os.path.isabs(args["chdir"]) else args["chdir"]
    ranks = []
    for local in range(nproc):
        rank = args["first_rank"] + local
        env = {**os.environ, **args["env"], "RANK": str(rank), "LOCAL_RANK": str(local),
               "WORLD_SIZE": str(args["world"]), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node),
               "FSDPCTL_NODE_RANK": str(node), "FSDPCTL_RUN_DIR": run_dir,
               "PYTHONPATH": os.pathsep.join([os.path.join(run_dir, "pkg", "fsdpctl", "node", "startup"), cwd,
                                              os.path.join(run_dir, "pkg")])}  # fsdpctl's start-up hook first
        process = subprocess.Popen([sys.executable, *args["entry"]], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        prefix = f"[rank{rank}]:".encode()
        reader = threading.Thread(target=lambda p=process, pre=prefix: [write(pre + line) for line in p.stdout],
                                  daemon=True)
        reader.start()
        ranks.append((rank, local, process, reader))
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    failed = None
    while any(p.poll() is None for _, _, p, _ in ranks) and not stopping:
        failed = failed or next(((r, lr, p) for r, lr, p, _ in ranks if p.poll() not in (None, 0)), None)
        if failed:
            break
        time.sleep(0.05)
    failed = failed or next(((r, lr, p) for r, lr, p, _ in ranks if p.poll() not in (None, 0)), None)
    for _, _, process, _ in ranks:  # what a failure or a stop leaves running ends too, as under torchrun
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 5
    while any(p.poll() is None for _, _, p, _ in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    for _, _, process, reader in ranks:
        if process.poll() is None:
            process.kill()
        process.wait()
        reader.join(5)
    code = 0
    if stopping:
        code = 128 + stopping[0]
    elif failed:
        rank, local, process = failed
        stamp = dt.datetime.now().strftime("%Y-%m-%d_%H:%M:%S")
        write(("Root Cause (first observed failure):\n[0]:\n"
               f"  time      : {stamp}\n  host      : {args['host']}\n  rank      : {rank} (local_rank: {local})\n"
               f"  exitcode  : {process.returncode} (pid: {process.pid})\n  error_file: <N/A>\n").encode())
        code = 1
    log.close()
    # Written aside and renamed, as the real nodes' wrapper does: a follower that read the file between
    # its creation and its write saw no code (255), took it for a failure and stopped the other nodes.
    exit_file = os.path.join(run_dir, f"node{node}.exit")
    with open(f"{exit_file}.{os.getpid()}", "w") as handle:
        handle.write(f"{code}\n")
    os.replace(f"{exit_file}.{os.getpid()}", exit_file)
    return code


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
