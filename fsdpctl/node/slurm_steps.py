"""A Slurm job with spare nodes: run the training step on the nodes it needs, and when a node fails,
run the next step in the same allocation on the healthy ones: ``python -m fsdpctl.node.slurm_steps
--nodes N -- COMMAND...`` in the batch script, on the job's first node.

The job holds ``N + K`` nodes (``--no-kill``: a failed node does not end the allocation). The first N
in Slurm's order run the step (``srun --nodelist``); Slurm numbers a step's nodes in that order, so
``$SLURM_NODEID`` (fsdpctl's node rank) follows it. When the step fails, a node is to blame when it
fails the re-check (a one-task step running the node's Python, and with GPUs asked for, counting
them: a node whose slurmd is gone fails it) or when its ranks died by a signal no other node's ranks
got (torchrun's summary in its log). Each such node is replaced by the first spare that passes the
same re-check, and the next step runs from the newest checkpoint (the workload resumes one when it is
there). A program's own error blames no node and ends the job with its exit code, as without spares;
so does a node to blame with no spare left, unless the job is elastic (``--min-nodes K``): then the
next step runs on the healthy nodes (at least K of them; the spares that passed in their places),
from the newest checkpoint, and every rank is told how often the node count changed
(``FSDPCTL_ELASTIC_ATTEMPT``; the bundled workload keeps its global batch). Every decision is
appended to ``slurm-steps.jsonl`` in the run directory (``status`` reads it) and said in the node
log of the rank it concerns.

Standard library only, Python 3.8+: this runs on a node with nothing of fsdpctl installed.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from fsdpctl.node.gpu_watch import fault_in_log
from fsdpctl.node.torchrun_summary import summary_signal
from fsdpctl.workload.elastic import ELASTIC_ATTEMPT
from fsdpctl.workload.layout import complete_steps

EVENTS_FILE = "slurm-steps.jsonl"
PROBE_SECONDS = 120.0
LOG_TAIL_BYTES = 256 * 1024
_OUR_STOP = (1, 2, 15)  # SIGHUP, SIGINT, SIGTERM: a stop (Slurm's, srun's or a user's), never a node's fault


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _run(argv, timeout=60.0):
    """(exit status, stdout, stderr) of a client command; 124 when it ran out of time."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return 124, "", f"no answer in {exc.timeout:.0f} s"
    except OSError as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def allocation_hosts(nodelist):
    """The job's nodes in Slurm's order (the order it numbers a step's nodes in)."""
    status, out, err = _run(["scontrol", "show", "hostnames", nodelist])
    if status != 0:
        raise SystemExit(f"fsdpctl: scontrol show hostnames {nodelist} failed: {err.strip()}")
    return out.split()


def node_address(host):
    """The address other nodes reach ``host`` at, as Slurm knows it (else its name)."""
    status, out, _ = _run(["scontrol", "show", "node", host])
    match = re.search(r"NodeAddr=(\S+)", out) if status == 0 else None
    return match.group(1) if match else host


def probe_command(python, gpus):
    """What the re-check runs on a node: its Python answers, and sees ``gpus`` GPUs when asked."""
    if not gpus:
        return [python, "-c", "pass"]
    check = ("import sys, torch; n = torch.cuda.device_count(); "
             f"sys.exit(0 if n >= {gpus} else 'sees %d GPU(s) of {gpus}' % n)")
    return [python, "-c", check]


def recheck(host, python, gpus, timeout=PROBE_SECONDS):
    """None when ``host`` passes the re-check, else why not (one line)."""
    argv = ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--kill-on-bad-exit=0", "--quiet",
            *probe_command(python, gpus)]
    status, _, err = _run(argv, timeout)
    if status == 0:
        return None
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    # The probe's own last words (a GPU missing) when it ran, else srun's first error (no slurmd there)
    own = [line for line in lines if not line.startswith(("srun:", "slurmstepd"))]
    srun_errors = [line[len("srun: error: "):] for line in lines if line.startswith("srun: error: ")]
    why = own[-1] if own else srun_errors[0] if srun_errors else f"exit {status}"
    return f"failed the re-check: {why}"


def last_train_step(run_dir):
    """(step, time) of the newest training line in metrics.jsonl (None, None: none yet)."""
    for line in reversed(_log_tail(os.path.join(run_dir, "metrics.jsonl")).splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("kind") == "train":
            return row.get("step"), row.get("time")
    return None, None


def newest_checkpoint(run_dir):
    """The step of the newest complete checkpoint (the next step resumes from it), None: none."""
    steps = complete_steps(Path(run_dir))
    return steps[-1] if steps else None


def _log_tail(path):
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def signalled_alone(hosts, run_dir):
    """Hosts whose ranks died by a signal no other node's ranks got (host -> why), from the node logs."""
    signals = {host: summary_signal(_log_tail(os.path.join(run_dir, f"node{rank}.log")))
               for rank, host in enumerate(hosts)}
    blamed = {}
    for host, signum in signals.items():
        if signum and signum not in _OUR_STOP and list(signals.values()).count(signum) == 1:
            blamed[host] = f"its ranks died by signal {signum}, which no other node's got"
    return blamed


def choose(active, spares, blamed, allocation, passes):
    """The next step's nodes: the active ones not blamed, each blamed one replaced by the first spare
    that ``passes`` (host -> None or why not); in Slurm's order. Returns (nodes, replacements, spares
    left, spares that failed (host -> why)); nodes is None when too few spares pass."""
    replacements, failed, left = [], {}, list(spares)
    for host in [h for h in active if h in blamed]:
        while left:
            spare = left.pop(0)
            why_not = passes(spare)
            if why_not is None:
                replacements.append({"host": host, "by": spare, "why": blamed[host]})
                break
            failed[spare] = why_not
        else:
            return None, replacements, left, failed
    taken = {r["host"]: r["by"] for r in replacements}
    nodes = sorted((taken.get(h, h) for h in active), key=allocation.index)
    return nodes, replacements, left, failed


def recorded_changes(run_dir, planned):
    """(how often the node count changed, the newest step's node count) from the steps the job's
    earlier starts recorded (a requeue starts the batch script again with the plan's count,
    ``planned``); (planned, None) on the job's first start."""
    counts = []
    try:
        with open(os.path.join(run_dir, EVENTS_FILE), encoding="utf-8") as handle:
            for line in handle:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                if isinstance(event, dict) and event.get("event") == "step" and event.get("hosts"):
                    counts.append(len(event["hosts"]))
    except OSError:
        pass
    changed = sum(1 for i in range(1, len(counts)) if counts[i] != counts[i - 1])
    return planned + changed, (counts[-1] if counts else None)


def shrink(active, blamed, replacements, allocation, min_nodes):
    """When too few spares pass: the nodes an elastic job goes on with (the active ones not blamed,
    the spares that passed in their places), in Slurm's order; None when they are fewer than
    ``min_nodes`` (0: the job is not elastic)."""
    if not min_nodes:
        return None
    taken = {r["host"]: r["by"] for r in replacements}
    healthy = [taken.get(h, h) for h in active if h not in blamed or h in taken]
    return sorted(healthy, key=allocation.index) if len(healthy) >= min_nodes else None


class Steps:
    """The job's steps, their failures, replacements and shrinks, recorded in the run directory."""

    def __init__(self, run_dir, nodes, python, gpus, command, srun_flags=(), min_nodes=0):
        self.run_dir, self.nodes, self.python, self.gpus, self.command = run_dir, nodes, python, gpus, command
        self.srun_flags, self.min_nodes, self.count = list(srun_flags), min_nodes, nodes
        self.job = os.environ.get("SLURM_JOB_ID", "")
        self.start = int(os.environ.get("SLURM_RESTART_COUNT") or 0) + 1
        self.changes, self.last_count = recorded_changes(run_dir, int(os.environ.get(ELASTIC_ATTEMPT) or 0))
        """How often the node count changed (the plan's count, then one more for each change between two
        steps, those of the job's earlier starts included), and the newest step's node count before
        this start (None: its first)."""

    def record(self, event, **fields):
        line = json.dumps({"event": event, "job": self.job, "slurm_start": self.start, "at": _now(),
                           "at_s": round(time.time(), 3), **fields})
        with open(os.path.join(self.run_dir, EVENTS_FILE), "a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    def say(self, text, rank=None):
        """One line in the batch output, and in the node log of ``rank`` (followed like the ranks')."""
        print(f"fsdpctl: {text}", flush=True)
        for node in range(self.count) if rank is None else (rank,):
            with open(os.path.join(self.run_dir, f"node{node}.log"), "a", encoding="utf-8") as handle:
                handle.write(f"fsdpctl: {text}\n")

    def recheck_all(self, hosts):
        """Every host's re-check at once (host -> None or why not): a node that is gone takes Slurm's
        message timeout to say so, the others should not wait behind it."""
        found = {}
        threads = [threading.Thread(target=lambda h=h: found.__setitem__(h, recheck(h, self.python, self.gpus)))
                   for h in hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return {h: found.get(h) for h in hosts}

    def step_env(self, number, head_addr):
        """A step's environment: this one's, the head's address, the step, and in an elastic job how
        often the node count changed (over the batch script's export of the plan's count)."""
        env = dict(os.environ, FSDPCTL_HEAD_ADDR=head_addr, FSDPCTL_SLURM_STEP=str(number))
        if self.min_nodes:
            env[ELASTIC_ATTEMPT] = str(self.changes)
        return env

    def run_step(self, number, hosts):
        if self.last_count is not None and self.last_count != len(hosts):
            self.changes += 1  # a requeued job back on its whole allocation after a shrink: the count changed
        self.count = self.last_count = len(hosts)
        env = self.step_env(number, node_address(hosts[0]))
        self.record("step", step=number, hosts=hosts)
        argv = ["srun", "--kill-on-bad-exit=1", f"--nodes={self.count}", f"--ntasks={self.count}",
                "--ntasks-per-node=1", f"--nodelist={','.join(hosts)}", *self.srun_flags, *self.command]
        return subprocess.call(argv, env=env)

    def run(self, allocation):
        """Steps until one succeeds, a failure blames no node, or no spare is left (an elastic job: too
        few healthy nodes); the exit status."""
        active, spares = allocation[:self.nodes], allocation[self.nodes:]
        number = 1
        while True:
            status = self.run_step(number, active)
            if status == 0:
                self.record("succeeded", step=number)
                return 0
            blamed = {h: why for h, why in self.recheck_all(active).items() if why}
            for host, why in signalled_alone(active, self.run_dir).items():
                blamed.setdefault(host, why)
            for rank, host in enumerate(active):  # a GPU fault the node's watcher said during the step
                fault = fault_in_log(_log_tail(os.path.join(self.run_dir, f"node{rank}.log")))
                if fault:
                    blamed.setdefault(host, f"hardware fault during the step: {fault}")
            if not blamed:
                self.record("failed", step=number, exit=status, blamed={})
                self.say(f"step {number} failed (exit {status}) and no node is to blame: a program error ends "
                         f"the job")
                return status
            last_step, last_at = last_train_step(self.run_dir)
            nodes, replacements, spares, failed = choose(
                active, spares, blamed, allocation, lambda h: recheck(h, self.python, self.gpus))
            self.record("failed", step=number, exit=status, blamed=blamed, spares_failed=failed,
                        last_step=last_step, last_step_at=last_at)
            for spare, why in failed.items():
                self.say(f"spare {spare} is passed over: {why}")
            shrunk = shrink(active, blamed, replacements, allocation, self.min_nodes) if nodes is None else None
            if nodes is None and shrunk is None:
                return self.end(number, status, active, blamed, replacements)
            number += 1
            if shrunk is not None:
                self.shrunk(number, active, shrunk, blamed, replacements)
                nodes = shrunk
            else:
                self.record("replaced", step=number, replacements=replacements, hosts=nodes,
                            from_step=newest_checkpoint(self.run_dir))
            for change in replacements:
                rank = nodes.index(change["by"])
                self.say(f"{change['by']} replaces {change['host']} as node {rank} for step {number} "
                         f"({change['why']}); it continues from the newest checkpoint", rank=rank)
            active = nodes

    def end(self, number, status, active, blamed, replacements):
        """No spare left for a node to blame (an elastic job: fewer healthy nodes than min_nodes)."""
        missing = len(blamed) - len(replacements)
        left = (f"; {len(active) - missing} node(s) left, fewer than min_nodes {self.min_nodes}"
                if self.min_nodes else "")
        self.say(f"step {number} failed (exit {status}); {', '.join(sorted(blamed))} to blame "
                 f"({'; '.join(blamed[h] for h in sorted(blamed))}) and no spare left: {missing} "
                 f"node(s) missing{left}, the job ends")
        why = f"fewer than min_nodes {self.min_nodes}" if self.min_nodes else "no spare left"
        self.record("ended", step=number, why=why, missing=missing)
        return status

    def shrunk(self, number, active, nodes, blamed, replacements):
        """Step ``number`` runs on fewer nodes: record it, say it, count the change."""
        replaced = {r["host"] for r in replacements}
        out = [h for h in active if h in blamed and h not in replaced]
        why = "; ".join(blamed[h] for h in out)
        self.record("shrunk", step=number, hosts=nodes, out=out, why=why, nodes=len(nodes), before=len(active),
                    full=self.nodes, from_step=newest_checkpoint(self.run_dir), replacements=replacements,
                    min_nodes=self.min_nodes)
        self.count = len(nodes)
        self.say(f"step {number} runs on {len(nodes)} of {self.nodes} nodes: {', '.join(out)} out ({why}); "
                 f"it continues from the newest checkpoint (min_nodes {self.min_nodes})", rank=0)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fsdpctl.node.slurm_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True, help="nodes each step runs on")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="GPUs the re-check expects on a node")
    parser.add_argument("--python", default=sys.executable, help="the nodes' Python (the re-check runs it)")
    parser.add_argument("--srun-flag", action="append", default=[], help="a flag for every step's srun (Pyxis's)")
    parser.add_argument("--min-nodes", type=int, default=0, help="with no spare left, go on with at least this many "
                        "healthy nodes (0: end the job)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then what srun runs on every node")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    if not 0 <= args.min_nodes <= args.nodes:
        parser.error(f"--min-nodes {args.min_nodes}: give 0 (off) to --nodes ({args.nodes})")
    allocation = allocation_hosts(os.environ["SLURM_JOB_NODELIST"])
    if len(allocation) < args.nodes:
        print(f"fsdpctl: the job holds {len(allocation)} node(s) and a step needs {args.nodes}", file=sys.stderr)
        return 1
    run_dir = os.environ.get("FSDPCTL_RUN_DIR") or os.getcwd()
    steps = Steps(run_dir, args.nodes, args.python, args.gpus_per_node, command, args.srun_flag, args.min_nodes)
    return steps.run(allocation)


if __name__ == "__main__":
    sys.exit(main())
