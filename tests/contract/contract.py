"""What every backend must do, as tests every backend passes: start a run and follow it to its outcome,
read its lines back (host, node rank and global rank on each), its status, fetch and report; a failing
rank's exit code and the rank named as the root cause; stop; and resume into a next attempt that keeps
the last one's logs. Each backend's module subclasses ``Contract`` and gives it a ``cluster``.

The scenarios run through the public Python API in a process of their own, as a user's script would
(inside the lab's client namespace for the backends that need one), with a small program of the
user's that needs no torch, so that what is measured is the backend, not the workload.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO

PROGRAM = """\
import json, os, signal, sys, time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["FSDPCTL_ATTEMPT"])
mode = sys.argv[1]
print(f"hello from rank {rank} of {world} on node {os.environ['FSDPCTL_NODE_RANK']}, attempt {attempt}", flush=True)
if rank == 0:
    with open(os.path.join(os.environ["FSDPCTL_RUN_DIR"], "metrics.jsonl"), "a") as metrics:
        for step in (1, 2, 3):
            metrics.write(json.dumps({"kind": "train", "step": step, "loss": 6.0 / step, "tokens_per_s": 1000.0,
                                      "attempt": attempt}) + "\\n")
if mode in ("fail", "fail-once") and rank == int(sys.argv[2]) and (mode == "fail" or attempt == 1):
    time.sleep(0.5)  # the other ranks are under way when it fails
    print(f"rank {rank} fails on purpose with exit {sys.argv[3]}", flush=True)
    os._exit(int(sys.argv[3]))
if mode == "wait":
    print(f"rank {rank} is ready", flush=True)
    time.sleep(600)
if mode == "die-in-shutdown" and rank == int(sys.argv[2]):
    class DiesInShutdown:
        def __del__(self):  # when the interpreter clears this module: after the program and its exit handlers
            os.kill(os.getpid(), signal.SIGABRT)
    dies_in_shutdown = DiesInShutdown()
print(f"rank {rank} done", flush=True)
"""

PRELUDE = '''\
import json, os, sys, time
import fsdpctl


def report(value):
    print("REPORT " + json.dumps(value, default=str), flush=True)


def outcome_json(outcome):
    failure = outcome.first_failure
    return {"exit_code": outcome.exit_code, "state": str(outcome.state),
            "failure": failure.to_json() if failure else None}


def lines_of(run, **which):
    return [[line.node_rank, line.rank, line.host, line.text] for line in run.logs(**which)]

'''


@dataclass
class Cluster:
    """A backend to hold to the contract: its profile, how its runs are started, where they are, and
    how an API script is run against it."""

    name: str
    profile: Path
    world: int
    """Ranks in a run of the profile."""
    hosts: list[str]
    """The hosts the runs' lines name, by node rank."""
    runner: Callable[[list[str], dict[str, str], Path], subprocess.CompletedProcess]
    """Runs an argv (with this environment, in this folder) where the API can reach the nodes."""
    queued: bool = False
    """A scheduler's backend: runs are submitted (``fsdpctl.submit``), not launched."""
    env: dict[str, str] = field(default_factory=dict)

    def start(self, detach: bool = False) -> str:
        """The API call that starts a run of the program and returns its Run."""
        if self.queued:
            return f"lambda args: fsdpctl.submit(PROFILE, args, code=CODE, follow={not detach})"
        return f"lambda args: fsdpctl.launch(PROFILE, args, code=CODE, detach={detach})"

    def api(self, tmp_path: Path, body: str, timeout: float = 300) -> dict[str, Any]:
        """Run ``body`` (it calls ``report(...)`` once) with the program's code folder; what it reported."""
        code = tmp_path / "project"
        code.mkdir(exist_ok=True)
        (code / "program.py").write_text(PROGRAM)
        script = tmp_path / f"contract-{time.monotonic_ns()}.py"
        script.write_text(PRELUDE + f"PROFILE, CODE = {str(self.profile)!r}, {str(code)!r}\n"
                          + textwrap.dedent(body))
        env = {**os.environ, "HOME": str(tmp_path), "FSDPCTL_RUNS_DIR": str(tmp_path / "runs"), **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), self.env.get("PYTHONPATH")]))
        env.pop("SSH_AUTH_SOCK", None)
        done = self.runner([sys.executable, str(script)], env, tmp_path)
        found = [json.loads(line[len("REPORT "):]) for line in done.stdout.splitlines() if line.startswith("REPORT ")]
        assert done.returncode == 0 and found, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return found[0]


class Contract:
    """The contract. ``cluster`` (a fixture of the subclass's module) is the backend under test."""

    def test_a_run_is_followed_to_its_end_and_read_back(self, cluster: Cluster, tmp_path: Path):
        got = cluster.api(tmp_path, f"""
            run = ({cluster.start()})(["program.py", "ok"])
            outcome = run.wait()
            status = run.status()
            fetched = run.fetch("metrics.jsonl")
            summary = run.report().summaries[0]
            report({{"outcome": outcome_json(outcome), "status": status.to_json(), "lines": lines_of(run),
                    "rank1": lines_of(run, rank=1), "fetched": fetched, "steps": summary.steps,
                    "final_loss": summary.final_loss, "info": str(run.info.state), "backend": run.info.backend}})
        """)
        assert got["outcome"] == {"exit_code": 0, "state": "succeeded", "failure": None}
        assert got["status"]["state"] == "succeeded" and got["info"] == "succeeded" and got["backend"] == cluster.name
        assert [n["state"] for n in got["status"]["nodes"]] == ["succeeded"] * len(cluster.hosts)
        hello = {(rank, host) for node, rank, host, text in got["lines"] if text.startswith("hello from rank")}
        assert {rank for rank, _ in hello} == set(range(cluster.world)), got["lines"]
        assert {host for _, host in hello} == set(cluster.hosts)
        for node, rank, host, text in got["lines"]:  # every line knows where it came from
            assert host == cluster.hosts[node], (node, host)
            if said := re.match(r"(?:hello from )?rank (\d+)", text):  # the program names its own rank
                assert int(said.group(1)) == rank, (rank, text)
        assert {rank for _, rank, _, _ in got["rank1"]} == {1} and len(got["rank1"]) >= 2
        assert any(Path(f).name == "metrics.jsonl" for files in got["fetched"].values() for f in files), got["fetched"]
        assert got["steps"] == 3 and got["final_loss"] == 2.0

    def test_a_failing_rank_gives_the_run_its_exit_code_and_is_named(self, cluster: Cluster, tmp_path: Path):
        failing = cluster.world - 1  # on the last node
        got = cluster.api(tmp_path, f"""
            run = ({cluster.start()})(["program.py", "fail", "{failing}", "3"])
            outcome = run.wait()
            report({{"outcome": outcome_json(outcome), "status": run.status().to_json(),
                    "lines": lines_of(run)}})
        """)
        outcome, failure = got["outcome"], got["outcome"]["failure"]
        assert outcome["exit_code"] == 3 and outcome["state"] == "failed", got
        assert failure["rank"] == failing and failure["host"] == cluster.hosts[-1], failure
        assert failure["exit_code"] == 3 and any("fails on purpose" in line for line in failure["last_lines"])
        status = got["status"]
        assert status["state"] == "failed" and status["exit_code"] == 3
        assert status["first_failure"]["rank"] == failing
        assert any(text == f"rank {failing} fails on purpose with exit 3" and rank == failing
                   for _, rank, _, text in got["lines"])

    def test_a_rank_that_dies_in_pythons_shutdown_is_said_to_have_ended_its_program(self, cluster: Cluster,
                                                                                      tmp_path: Path):
        """Its exit is still the signal's (a process that aborts did not exit 0), but the failure says the
        program had run to its end: the work is done, and the crash came in the interpreter's shutdown."""
        failing = cluster.world - 1
        got = cluster.api(tmp_path, f"""
            run = ({cluster.start()})(["program.py", "die-in-shutdown", "{failing}"])
            outcome = run.wait()
            report({{"outcome": outcome_json(outcome), "lines": lines_of(run, rank={failing})}})
        """)
        failure = got["outcome"]["failure"]
        assert got["outcome"]["exit_code"] == 134 and failure["signal"] == 6, got
        assert failure["rank"] == failing and failure["in_shutdown"] is True, failure
        assert [text for _, _, _, text in got["lines"] if text.startswith("rank ")] == [f"rank {failing} done"]

    def test_stop_ends_a_run_and_it_stays_stopped(self, cluster: Cluster, tmp_path: Path):
        got = cluster.api(tmp_path, f"""
            run = ({cluster.start(detach=True)})(["program.py", "wait"])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                ready = {{rank for _, rank, _, text in lines_of(run) if text.endswith("is ready")}}
                if len(ready) == {cluster.world}:
                    break
                time.sleep(0.5)
            live = run.status().to_json()
            remaining = run.stop()
            time.sleep(1)
            report({{"ready": sorted(ready), "live": live["state"], "remaining": remaining,
                    "status": run.status().to_json(), "outcome": outcome_json(run.wait())}})
        """)
        assert got["ready"] == list(range(cluster.world)) and got["live"] == "running", got
        assert not any(got["remaining"].values()), got["remaining"]
        assert got["status"]["state"] == "stopped" and got["outcome"]["state"] == "stopped"

    def test_resume_starts_the_next_attempt_and_keeps_the_last_ones_logs(self, cluster: Cluster, tmp_path: Path):
        got = cluster.api(tmp_path, f"""
            run = ({cluster.start()})(["program.py", "fail-once", "0", "5"])
            first = outcome_json(run.wait())
            run.resume(detach={cluster.queued})
            second = outcome_json(run.wait())
            status = run.status().to_json()
            report({{"first": first, "second": second, "status": status, "attempt": run.attempt,
                    "earlier": lines_of(run, attempt=1), "newest": lines_of(run)}})
        """)
        assert got["first"]["exit_code"] == 5 and got["first"]["failure"]["rank"] == 0
        assert got["second"] == {"exit_code": 0, "state": "succeeded", "failure": None}, got["second"]
        assert got["attempt"] == 2 and got["status"]["attempt"] == 2
        earlier = got["status"]["attempts"]
        assert [(a["attempt"], a["state"], a["exit_code"]) for a in earlier] == [(1, "failed", 5)]
        assert any("fails on purpose" in text for *_, text in got["earlier"])
        assert not any("fails on purpose" in text for *_, text in got["newest"])
        assert any(text.endswith("attempt 2") for *_, text in got["newest"])
