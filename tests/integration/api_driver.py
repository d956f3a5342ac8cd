"""Driving fsdpctl's Python API inside the lab's client namespace, as a user's script would: a test
writes the script's body, the driver runs it there (in the foreground, or in the background like a
notebook left running) and reads back what it reported with ``report(...)``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from tests.integration.test_launch import fsdpctl

PRELUDE = '''\
import faulthandler, json, os, signal, sys, time
import fsdpctl
from fsdpctl import *

faulthandler.register(signal.SIGUSR1, all_threads=True)  # a script that does not end shows where it is


def report(value):
    """What the test reads back: one JSON line."""
    print("REPORT " + json.dumps(value, default=str), flush=True)


def outcome_json(outcome):
    failure = outcome.first_failure
    return {"exit_code": outcome.exit_code, "state": str(outcome.state), "ok": outcome.ok,
            "failure": failure.to_json() if failure else None, "message": outcome.message}

'''


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / f"api-{time.monotonic_ns()}.py"
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


def argv_env(lab, tmp_path: Path, body: str, env: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The script's command line and environment (``env``: variables over fsdpctl's tests' own, such
    as a secret that must reach the script only through its environment)."""
    argv, base = fsdpctl(lab, tmp_path)
    python_at = argv.index(sys.executable)
    return [*argv[:python_at], sys.executable, str(script(tmp_path, body))], {**base, **(env or {})}


def reports(stdout: str) -> list[Any]:
    return [json.loads(line[len("REPORT "):]) for line in stdout.splitlines() if line.startswith("REPORT ")]


def api(lab, tmp_path: Path, body: str, timeout: float = 300) -> tuple[list[Any], subprocess.CompletedProcess]:
    """Run a script of the API to its end; (what it reported, the process)."""
    argv, env = argv_env(lab, tmp_path, body)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return reports(done.stdout), done


class Background:
    """A script of the API running in the background; its output goes to files."""

    def __init__(self, lab, tmp_path: Path, body: str, env: dict[str, str] | None = None):
        argv, env = argv_env(lab, tmp_path, body, env)
        self.out_path = tmp_path / f"api-out-{time.monotonic_ns()}"
        self.err_path = self.out_path.with_suffix(".err")
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            # SIGINT as a terminal's script has it: a pytest-xdist worker ignores it, its children would
            # inherit that, and Python then never turns a SIGINT into a KeyboardInterrupt.
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=tmp_path,
                                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def finish(self, timeout: float) -> tuple[int, list[Any], str]:
        """The script's exit code, what it reported and its stderr; a script still running after
        ``timeout`` seconds fails the test with every thread's stack (then it is killed)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(2)
            self.process.kill()
            self.process.wait(timeout=10)
            raise AssertionError(f"the script did not end within {timeout} s; it reported "
                                 f"{reports(self.out_path.read_text())}; its threads and stderr:\n"
                                 f"{self.err_path.read_text()[-12000:]}") from None
        return code, reports(self.out_path.read_text()), self.err_path.read_text()


def python(lab, tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python ARGS`` in the client namespace, with the environment fsdpctl's tests give it."""
    argv, env = fsdpctl(lab, tmp_path)
    python_at = argv.index(sys.executable)
    return subprocess.run([*argv[:python_at], sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)
