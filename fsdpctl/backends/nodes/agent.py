"""The node's side of a launch, in one command: stage what the launcher sends, answer the preflight
probe, wait for the launcher's word, start the node script detached, and (for a foreground run)
watch over it for the launcher until it ends.

Sent as ``python -c`` after the probe's own source (``agent_source``), so it runs with whatever
Python the profile names, needs nothing installed, and uses the standard library only (3.8+).
One SSH command per node does what took several (probe, stage, start, follow, poll): each command
costs a login shell and its rc files on the node, and the launch waits on them.

Protocol on the command's stdin/stdout (argument: JSON with run_id, run_dir, rank, bytes,
secret_bytes, probe, go_timeout):

1. the launcher writes ``bytes`` bytes: an uncompressed tar of the node scripts, the workload
   package (``pkg/``) and the user's code (``code/``); the agent unpacks it into ``run_dir``
   (privately first, so nodes sharing ``run_dir`` on NFS never see half a file, and readable by this
   user only); then ``secret_bytes`` bytes of JSON, the run's secrets, kept in memory only;
2. with ``probe``: the agent prints the probe's facts between its sentinels; then, where some
   nodes' probes did not reach the master's rendezvous port, the launcher may ask for a port round
   (``port <json>``: ``port_probe.answer_port``; the master listens until ``over``), each answered
   between the same sentinels;
3. it reads one line past the launcher's heartbeats (``hb``, sent to every staged agent while the
   others are staged and probed): ``go <node_timeout>`` starts the node; anything else (or the end
   of input, or ``go_timeout`` seconds of silence) does not, and what this agent staged is removed
   again; with ``archive`` (a later attempt of the run), the last attempt's files of this node move
   into ``archive.to`` first;
4. it starts ``bash node<R>.sh`` in a session of its own, with the secrets in its environment
   (never on disk or in a command line), writing ``node<R>.pid``, ``node<R>.log`` (through
   ``fsdpctl.node.mask`` when there are secrets) and, when it ends, ``node<R>.exit``; prints
   ``fsdpctl-agent: pid <N>``;
5. with a node timeout (a foreground run; 0: detached, the agent leaves now), it stays: it sends
   every byte the node logs, in frames (``|<n>``, a newline, n bytes), as fast as the launcher
   takes them (never dropping any: the log waits on disk), ``!alive`` every few seconds ahead of
   waiting log data, and ``!exit <code>`` after the log's last byte. It reads the launcher's ``hb``
   (heartbeat), ``stop`` (TERM, a grace period, KILL), ``fail`` (the same with a short grace: another
   node failed) and ``kill``. When the launcher's input ends
   (it died, or its connection closed) or nothing came for the node timeout (a cut link), the agent
   itself ends every process of the run: a node never outlives its launcher. With ``side`` (the
   run's metrics, the node's GPU samples: ``fsdpctl.node.side_files``), what those files gain goes
   out too, as ``+`` frames between the log's, a bounded amount per poll, the last of it before the
   agent leaves.
"""

import os
import select
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time

AGENT_STARTED = "fsdpctl-agent: pid"
AGENT_REFUSED = "fsdpctl-agent: not started"
# The node protocol's words, defined here once: this file runs on the node, and the launcher's side
# (``starter``, ``feeds``) imports them from it.
LINE = "|"
"""agent -> launcher: ``|<n>`` then n bytes of the node's log (a frame: any bytes, cut anywhere)."""
ALIVE = "!alive"
EXIT = "!exit"
"""agent -> launcher: ``!exit <code>``, the node's script has ended."""
STOPPED = "!stopped"
"""agent -> launcher: ``!stopped <why>``, the agent ended the run's processes itself."""
GO = "go"
"""launcher -> agent: ``go <node timeout>`` starts the node."""
HEARTBEAT = "hb"
STOP = "stop"
"""launcher -> agent: an orderly stop: the profile's stop signal to the ranks, its grace for them to save
and exit by themselves, then TERM, KILL (the agent's ``stop`` argument)."""
HALT = "halt"
"""launcher -> agent: TERM, a short grace, KILL (a hang: ranks stuck in a collective never get to a
signal handler, so no time is given to save)."""
KILL = "kill"
"""launcher -> agent: KILL now."""
FAIL = "fail"
"""launcher -> agent: another node failed: TERM, a short grace period, KILL."""
STOP_MARKER = ".fsdpctl-stop"
"""Written in the run directory before an orderly stop signals the ranks (``fsdpctl.workload.config``)."""
GRACE_SECONDS = 10.0
PEER_FAILED_GRACE_SECONDS = 2.0
"""Between TERM and KILL when another node failed: ranks waiting on a collective with a peer that is
gone never get to their signal handlers, so the grace is only for what exits at once (a program's
own cleanup); the next attempt, or the user, is not kept waiting."""
ORPHAN_GRACE_SECONDS = 5.0
"""Between TERM and KILL when the launcher is gone: the run ends within the node timeout + 10 s."""
OUT_LIMIT = 1 << 20
"""Log bytes waiting for the launcher before the agent stops reading the log (it reads on once they go)."""
SIDE_LIMIT = 256 << 10
"""Bytes of the side files (metrics, GPU samples) waiting for the launcher before the agent stops
reading them; the log's limit is apart, so neither holds the other back."""
SIDE_POLL_SECONDS = 0.5
"""How often the side files are read: each time, what every file gained goes out joined in one write
(one SSH packet for the launcher to take, not one per file per quarter second); a step's row still
reaches ``top`` within a second of its writing."""


def heartbeat_seconds(node_timeout):
    """How often each side says it is alive: several times per node timeout, at most every 5 s."""
    return max(1.0, min(5.0, node_timeout / 6.0))


class Input:
    """The launcher's side of stdin, read from the file descriptor itself: nothing is buffered away
    from the select() that waits on it."""

    def __init__(self, fd=0):
        self.fd = fd

    def read(self, n):
        return os.read(self.fd, n) if n > 0 else b""

    def read_exactly(self, n):
        data = b""
        while len(data) < n:
            chunk = os.read(self.fd, n - len(data))
            if not chunk:
                break
            data += chunk
        return data

    def read_line(self, timeout):
        """One line within ``timeout`` seconds ('' on end of input or timeout)."""
        deadline, line = time.time() + timeout, b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.time()))
            if not ready:
                return ""
            byte = os.read(self.fd, 1)
            if not byte:
                return ""
            line += byte
        return line.decode("utf-8", "replace").strip()

    def read_word(self, timeout):
        """The launcher's next line past its heartbeats (which a staged agent hears while the others
        are staged), each line within ``timeout`` seconds ('' on end of input or silence)."""
        while True:
            line = self.read_line(timeout)
            if line != HEARTBEAT:
                return line


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
        with tarfile.open(fileobj=payload, mode="r|", bufsize=1 << 16) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(scratch, filter="data")
            else:  # Python < 3.11.4: the launcher built this tar itself from relative names
                tar.extractall(scratch)
        while payload.read(1 << 16):  # the padding after the archive's end: the next bytes are the secrets
            pass
        for name in sorted(os.listdir(scratch)):
            source = os.path.join(scratch, name)
            if os.path.isdir(source):
                # Nodes may share the run directory: the first to arrive puts the folder in place;
                # the others' copies are the same files from the same launcher.
                if not os.path.exists(name):
                    try:
                        os.rename(source, name)
                        placed.append(name)
                    except OSError:
                        if not os.path.isdir(name):
                            raise  # not another node's copy arriving first
            else:
                os.replace(source, name)
                placed.append(name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return placed


def keep_apart(spec):
    """Move the last attempt's files of this node (``spec``: names, and the folder they go to) out
    of the way of the new attempt's, keeping their paths below that folder."""
    for name in spec["names"]:
        if os.path.lexists(name):
            target = os.path.join(spec["to"], name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                shutil.move(name, target)
            except FileNotFoundError:
                pass  # another node sharing the run directory moved it first


def start(rank, secrets):
    """Start the node script detached; its wrapper's pid is also its session and process group id."""
    import sys

    if secrets:  # what the ranks print goes through the mask on its way to the log, and torchrun's copies too
        mask = 'PYTHONPATH=pkg "$FSDPCTL_AGENT_PYTHON" -m fsdpctl.node.mask'
        output = ('2>&1 | %s > node%d.log; code="${PIPESTATUS[0]}"; %s --scrub logs/node%d; echo "$code"'
                  % (mask, rank, mask, rank))
    else:
        output = "> node%d.log 2>&1; echo $?" % rank
    # The exit file is written only while node<R>.pid still names this wrapper: on a run directory
    # the nodes share, a host that lost its link lives on, and when its script ends, the next
    # attempt's node R (on a spare) owns these names and must not read this attempt's end as its own.
    wrapper = ('echo $$ > node{r}.pid; bash node{r}.sh {out} > node{r}.exit.$$; '
               'if [ "$(cat node{r}.pid 2>/dev/null)" = "$$" ]; then mv node{r}.exit.$$ node{r}.exit; '
               'else rm -f node{r}.exit.$$; fi').format(r=rank, out=output)
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


def run_processes(run_id, node_rank=None, attempt=None):
    """Every process whose environment says it belongs to the run (torchrun puts its workers in
    sessions of their own: only the environment finds them all); with ``node_rank`` and ``attempt``,
    to that node and attempt of it only: an agent left from an earlier attempt must not end the next
    one's ranks on the same host, nor one node's agent another's where nodes share a machine."""
    marks = [("FSDPCTL_RUN_ID=%s" % run_id).encode()]
    for name, value in (("FSDPCTL_NODE_RANK", node_rank), ("FSDPCTL_ATTEMPT", attempt)):
        if value is not None:
            marks.append(("%s=%s" % (name, value)).encode())
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/environ" % name, "rb") as handle:
                    env = handle.read().split(b"\0")
            except OSError:
                continue
            if all(mark in env for mark in marks):
                found.append(int(name))
    return found


def _is_rank(pid):
    """A process torchrun started, or one of its children: ``LOCAL_RANK`` is in its environment."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            return any(entry.startswith(b"LOCAL_RANK=") for entry in handle.read().split(b"\0"))
    except OSError:
        return False


def _alive(pid):
    """Whether ``pid`` still runs (a zombie waiting for its parent to read its end does not)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def rank_roots(pids):
    """The ranks among ``pids``: processes torchrun started whose parent is not one (a rank's own
    children, data loader workers, are left to the rank)."""
    def parent(pid):
        try:
            with open("/proc/%d/status" % pid) as handle:
                for line in handle:
                    if line.startswith("PPid:"):
                        return int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass
        return None

    ranks = [pid for pid in pids if _is_rank(pid)]
    return [pid for pid in ranks if parent(pid) not in ranks]


def end_run(run_id, grace, node_rank=None, attempt=None, cleanup=None, first=None, marker=STOP_MARKER):
    """End every process of the run (of its node ``node_rank`` in ``attempt``); the pids left.

    With ``first`` (a signal number: the profile's stop signal), ``marker`` is written (the ranks
    read that the stop was asked for), the ranks get the signal first, at once, and ``grace``
    seconds to exit by themselves (a checkpoint's time), and the run's other processes (torchrun)
    with them; then TERM to what is left, 2 s, KILL.
    Without, TERM to every process, ``grace`` seconds, KILL. Then ``cleanup`` (shell removing its
    containers)."""
    if first is not None and grace > 0:
        try:
            open(marker, "w").close()
        except OSError:
            pass  # the ranks then exit as a signal from anyone else would have them
        roots = rank_roots(run_processes(run_id, node_rank, attempt))
        for pid in roots:
            try:
                os.kill(pid, first)
            except OSError:
                pass
        # the ranks save and leave; torchrun then sees them done and ends too (what the ranks leave behind,
        # a data loader worker that outlives its rank, is not waited for)
        deadline = time.time() + grace
        while roots and time.time() < deadline:
            left = run_processes(run_id, node_rank, attempt)
            if not [pid for pid in left if pid in roots or not _is_rank(pid)]:
                break
            time.sleep(0.1)
        grace = min(grace, 2.0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signalled = run_processes(run_id, node_rank, attempt)
        for pid in signalled:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        # Waited on by pid, not by scanning every process's environment again and again: with many
        # ranks to a node, or nodes sharing a machine, the scans held up the node's end. The next
        # round, and the count returned, scan again.
        deadline = time.time() + (grace if sig == signal.SIGTERM else 1.0)
        while any(_alive(pid) for pid in signalled) and time.time() < deadline:
            time.sleep(0.05)
    if cleanup and cleanup != "true":  # a bare run has no containers to remove: no shell to start
        run_quietly(["bash", "-c", cleanup], 90)  # noqa: F821 - comes with the probe's source
    return run_processes(run_id, node_rank, attempt)


def stop_with(spec):
    """(the signal, the grace) of a stop the launcher asks for: the profile's ``[name, seconds]``."""
    if not spec:
        return None, GRACE_SECONDS
    return getattr(signal, spec[0], signal.SIGTERM), float(spec[1])


def say(text):
    """One line to the launcher, at once."""
    import sys

    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def agent(args):
    """Steps 1-5 above; returns the exit status."""
    import json
    import sys

    os.umask(0o077)  # the run directory holds the user's code and outputs: theirs alone
    run_dir = os.path.expanduser(args["run_dir"])
    created = not os.path.isdir(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    os.chdir(run_dir)
    inp = Input()
    placed = stage(inp, args["bytes"])
    secrets = json.loads(inp.read_exactly(args["secret_bytes"]).decode("utf-8")) if args.get("secret_bytes") else {}
    if args.get("probe") is not None:
        answer(collect(args["probe"]))  # noqa: F821 - the probe's functions come first in the source
    go_timeout = args.get("go_timeout", 120.0)
    line = inp.read_word(go_timeout)
    while line.startswith(PORT_WORD + " "):  # noqa: F821 - a port round (port_probe, in the probe's source)
        asked = json.loads(line[len(PORT_WORD) + 1:])  # noqa: F821
        answer(answer_port(asked, lambda: inp.read_word(go_timeout), say))  # noqa: F821
        line = inp.read_word(go_timeout)
    word = line.split()
    if word[:1] != [GO]:
        for name in placed:
            shutil.rmtree(name, ignore_errors=True) if os.path.isdir(name) else os.remove(name)
        if created:
            os.chdir("/")
            shutil.rmtree(run_dir, ignore_errors=True)
        sys.stdout.write("%s\n" % AGENT_REFUSED)
        return 3
    if args.get("archive"):
        keep_apart(args["archive"])
    try:
        os.remove(STOP_MARKER)  # an earlier attempt's stop: this one was not asked to stop
    except OSError:
        pass
    sys.stdout.write("%s %d\n" % (AGENT_STARTED, start(args["rank"], secrets)))
    sys.stdout.flush()
    node_timeout = float(word[1]) if len(word) > 1 else 0.0
    if node_timeout > 0:
        return Watch(args["run_id"], args["rank"], node_timeout, inp, args.get("attempt"),  # noqa: F821
                     args.get("cleanup"), side_files(args.get("side")),  # noqa: F821 - agent_watch's
                     stop_with(args.get("stop"))).run()
    return 0


if __name__ == "__main__":
    import json
    import sys

    sys.exit(agent(json.loads(sys.argv[1])))
