"""Hand a profile request to the run's chosen ranks on this node: ``python -m fsdpctl.node.profile_request
RUN_ID RUN_DIR --node-rank N --ranks SPEC --request JSON``.

Each chosen rank's start-up hook reads its control pipe (``flight/rank<R>.trigger``, see
``fsdpctl.node.startup``); a message that starts with ``profile `` arms ``fsdpctl.node.profiling`` in
that rank. A rank without the hook's pipe (none was made: no real-time signals, an old run) is named
with why. The answer is one JSON line between ``BEGIN`` and ``END``: this node's host name and clock,
and per rank found its pid and whether the request reached it. Standard library only, Python 3.8+.
"""

import argparse
import json
import os
import socket
import sys
import time

from .profiling import chosen, parse_request
from .stacks import answer_of as answer_between
from .stacks import find_ranks, write_pipe

BEGIN, END = "<<<FSDPCTL-PROFILE-BEGIN>>>", "<<<FSDPCTL-PROFILE-END>>>"
MESSAGE = b"profile "


def send(run_id, run_dir, node_rank, spec, text):
    """The request written into every chosen rank's pipe on this node; what happened, per rank."""
    parse_request(text)
    found = find_ranks(run_id, node_rank)
    answers = []
    for pid, env in sorted(found.items(), key=lambda item: int(item[1]["RANK"])):
        rank, world = int(env["RANK"]), int(env.get("WORLD_SIZE", "1") or 1)
        if not chosen(spec, rank, world):
            continue
        pipe = os.path.join(run_dir, "flight", f"rank{rank}.trigger")
        answer = {"rank": rank, "pid": pid, "local_rank": int(env.get("LOCAL_RANK", "0") or 0), "sent": False}
        error = write_pipe(pipe, MESSAGE + text.encode())
        answer.update({"sent": True} if error is None else {"error": f"its start-up hook's pipe cannot be "
                                                                     f"written ({error})"})
        answers.append(answer)
    return {"host": socket.gethostname(), "clock_ns": time.time_ns(), "ranks": answers,
            "running": len(found), "node_rank": node_rank}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fsdpctl.node.profile_request")
    parser.add_argument("run_id")
    parser.add_argument("run_dir")
    parser.add_argument("--node-rank", type=int, default=None)
    parser.add_argument("--ranks", default="all")
    parser.add_argument("--request", required=True)
    args = parser.parse_args(argv)
    try:
        result = send(args.run_id, os.path.expanduser(args.run_dir), args.node_rank, args.ranks, args.request)
    except ValueError as exc:
        result = {"error": f"the request cannot be read: {exc}", "ranks": []}
    sys.stdout.write(BEGIN + json.dumps(result) + END + "\n")
    sys.stdout.flush()


def answer_of(output):
    """The node's answer in a command's output; ValueError when there is none."""
    return answer_between(output, BEGIN, END, "the profile request")


if __name__ == "__main__":
    main()
