"""The node's side of a launch, in one command: stage what the launcher sends, answer the preflight
probe, wait for the launcher's word, start the node script detached.

Sent as ``python -c`` after the probe's own source (``agent_source``), so it runs with whatever
Python the profile names, needs nothing installed, and uses the standard library only (3.8+).
One SSH command per node does what took three (probe, stage, start): each command costs a login
shell and its rc files on the node, and the launch waits on them.

Protocol on the command's stdin/stdout (argument: JSON with run_dir, rank, bytes, secret_bytes, probe,
go_timeout):

1. the launcher writes ``bytes`` bytes: an uncompressed tar of the node scripts, the workload
   package (``pkg/``) and the user's code (``code/``); the agent unpacks it into ``run_dir``
   (privately first, so nodes sharing ``run_dir`` on NFS never see half a file, and readable by this
   user only); then ``secret_bytes`` bytes of JSON, the run's secrets, kept in memory only;
2. with ``probe``: the agent prints the probe's facts between its sentinels, then reads one line:
   ``go`` starts the node, anything else (or end of input, or ``go_timeout`` seconds) does not, and
   what this agent staged is removed again;
3. it starts ``bash node<R>.sh`` in a session of its own (a dropped connection does not end it),
   with the secrets in its environment (never on disk or in a command line), writing ``node<R>.pid``,
   ``node<R>.log`` (through ``fsdpctl.node.mask`` when there are secrets) and, when it ends,
   ``node<R>.exit``; prints ``pid <N>``.
"""

import os
import select
import shutil
import subprocess
import tarfile
import tempfile

AGENT_STARTED = "fsdpctl-agent: pid"
AGENT_REFUSED = "fsdpctl-agent: not started"


class _Limited:
    """The first ``size`` bytes of a stream, as a file tarfile can stream from."""

    def __init__(self, stream, size):
        self.stream, self.left = stream, size

    def read(self, n=-1):
        if self.left <= 0:
            return b""
        data = self.stream.read(self.left if n is None or n < 0 else min(n, self.left))
        self.left -= len(data)
        return data


def stage(stream, size):
    """Unpack the launcher's tar into the current directory; returns the names this node put there."""
    scratch = tempfile.mkdtemp(prefix=".stage.", dir=".")
    placed = []
    payload = _Limited(stream, size)
    try:
        with tarfile.open(fileobj=payload, mode="r|") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(scratch, filter="data")
            else:  # Python < 3.11.4: the launcher built this tar itself from relative names
                tar.extractall(scratch)
        while payload.read(1 << 16):  # the padding after the archive's end: the next line is the launcher's word
            pass
        for name in sorted(os.listdir(scratch)):
            source = os.path.join(scratch, name)
            if os.path.isdir(source):
                # Nodes may share the run directory: the first to arrive puts the folder in place;
                # the others' copies are the same files from the same launcher.
                if not os.path.exists(name):
                    os.rename(source, name)
                    placed.append(name)
            else:
                os.replace(source, name)
                placed.append(name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return placed


def read_word(stream, timeout):
    """One line from the launcher within ``timeout`` seconds ('' on end of input or timeout)."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline().decode("utf-8", "replace").strip() if ready else ""


def start(rank, secrets):
    """Start the node script detached; its wrapper's pid is also its session and process group id."""
    import sys

    if secrets:  # what the ranks print goes through the mask on its way to the log, and torchrun's copies too
        mask = 'PYTHONPATH=pkg "$FSDPCTL_AGENT_PYTHON" -m fsdpctl.node.mask'
        output = ('2>&1 | %s > node%d.log; code="${PIPESTATUS[0]}"; %s --scrub logs/node%d; echo "$code"'
                  % (mask, rank, mask, rank))
    else:
        output = "> node%d.log 2>&1; echo $?" % rank
    wrapper = ("echo $$ > node%d.pid; bash node%d.sh %s > node%d.exit.tmp; mv node%d.exit.tmp node%d.exit"
               % (rank, rank, output, rank, rank, rank))
    for name in ("node%d.pid" % rank, "node%d.exit" % rank):
        if os.path.exists(name):
            os.remove(name)
    env = dict(os.environ, FSDPCTL_AGENT_PYTHON=sys.executable)
    if secrets:
        env.update(secrets)
        env["FSDPCTL_SECRET_NAMES"] = ",".join(sorted(secrets))
    process = subprocess.Popen(["bash", "-c", wrapper], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env)
    process.returncode = 0  # never waited for: it outlives this agent on purpose
    return process.pid


def agent(args):
    """Steps 1-3 above; returns the exit status."""
    import json
    import sys

    os.umask(0o077)  # the run directory holds the user's code and outputs: theirs alone
    run_dir = os.path.expanduser(args["run_dir"])
    created = not os.path.isdir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    os.chdir(run_dir)
    stdin = sys.stdin.buffer
    placed = stage(stdin, args["bytes"])
    secrets = json.loads(stdin.read(args["secret_bytes"]).decode("utf-8")) if args.get("secret_bytes") else {}
    if args.get("probe") is not None:
        answer(collect(args["probe"]))  # noqa: F821 - the probe's functions come first in the source
        if read_word(stdin, args.get("go_timeout", 120.0)) != "go":
            for name in placed:
                shutil.rmtree(name, ignore_errors=True) if os.path.isdir(name) else os.remove(name)
            if created:
                os.chdir("/")
                shutil.rmtree(run_dir, ignore_errors=True)
            sys.stdout.write("%s\n" % AGENT_REFUSED)
            return 3
    sys.stdout.write("%s %d\n" % (AGENT_STARTED, start(args["rank"], secrets)))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    import json
    import sys

    sys.exit(agent(json.loads(sys.argv[1])))
