"""Shared fixtures for the workload tests: one token cache for the session, and a runner for the
real entry point (``python -m fsdpctl.workload.train`` alone, or under torchrun)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
STARTUP_HOOK = REPO / "fsdpctl" / "node" / "startup"
VOCAB = 1024  # small vocabulary: a ~1.1M-parameter tiny GPT, fast on CPU
# Small, fast defaults for every run; a test's own flags come later and win (argparse: last wins).
BASE_FLAGS = ["--vocab-size", str(VOCAB), "--seq-len", "32", "--batch-size", "4",
              "--eval-steps", "2", "--log-interval", "1", "--warmup-steps", "2"]


# The AdamW runs that the parity and resume tests share (see the adamw_runs fixture).
ADAMW = ["--optimizer", "adamw", "--lr", "3e-3", "--steps", "20", "--eval-interval", "0",
         "--mixed-precision", "fp32"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_cmd(nproc: int, nnodes: int = 1, node_rank: int = 0, port: int | None = None) -> list[str]:
    """torchrun with a static rendezvous on a port of our own (parallel runs never collide)."""
    port = port or free_port()
    return [str(VENV_BIN / "torchrun"), f"--nnodes={nnodes}", f"--node-rank={node_rank}",
            f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}",
            "--max-restarts=0", "-m", "fsdpctl.workload.train"]


def child_env(run_dir: Path | None = None) -> dict[str, str]:
    """The ranks' environment as a launch gives it: fsdpctl's start-up hook first on the path (with
    ``run_dir`` it is fully armed: stack dumps on a signal, the flight-recorder pipe), so every
    workload test also proves the hook changes nothing of the training."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(STARTUP_HOOK), str(REPO), env.get("PYTHONPATH", "")])
    if run_dir is not None:
        env["FSDPCTL_RUN_DIR"] = str(run_dir)
    return env


class Result:
    def __init__(self, proc: subprocess.CompletedProcess, run_dir: Path):
        self.returncode, self.stdout, self.stderr = proc.returncode, proc.stdout, proc.stderr
        self.run_dir = run_dir

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def losses(self) -> dict[int, float]:
        return {row["step"]: row["loss"] for row in self.rows("train")}

    def val_losses(self) -> dict[int, float]:
        return {row["step"]: row["val_loss"] for row in self.rows("val")}

    def rows(self, kind: str) -> list[dict]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [row for row in map(json.loads, lines) if row["kind"] == kind]

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def error_lines(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith("fsdpctl.workload: ")
                and ";" in line and "world=" not in line]


class Runner:
    """Runs the trainer on the session's token cache; checks the exit status."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir

    def __call__(self, run_dir: Path, *flags: str, nproc: int = 1, expect_rc: int | None = 0,
                 timeout: float = 300) -> Result:
        argv = [*BASE_FLAGS, "--cache-dir", str(self.cache_dir), "--run-dir", str(run_dir), *flags]
        if nproc == 1:
            cmd = [sys.executable, "-m", "fsdpctl.workload.train", *argv]
        else:
            cmd = [*torchrun_cmd(nproc), *argv]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(run_dir), cwd=REPO,
                              timeout=timeout)
        result = Result(proc, run_dir)
        if expect_rc is not None and proc.returncode != expect_rc:
            raise AssertionError(f"exit {proc.returncode} (wanted {expect_rc}) for {' '.join(cmd)}\n"
                                 f"{result.output[-6000:]}")
        return result

    def torchrun_nodes(self, run_dir: Path, *flags: str, nnodes: int = 2,
                       timeout: float = 300) -> list[subprocess.CompletedProcess]:
        """Fake ``nnodes`` nodes of one process each on this machine (one torchrun per node)."""
        argv = [*BASE_FLAGS, "--cache-dir", str(self.cache_dir), "--run-dir", str(run_dir), *flags]
        port = free_port()
        procs = [subprocess.Popen([*torchrun_cmd(1, nnodes, rank, port), *argv], cwd=REPO,
                                  env=child_env(run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True) for rank in range(nnodes)]
        done = []
        try:
            for proc in procs:
                out, _ = proc.communicate(timeout=timeout)
                done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, ""))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return done


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    """Builtin corpus + tokenizer + token files, built once in this process for every run."""
    from fsdpctl.workload import data

    cache = tmp_path_factory.mktemp("fsdpctl-cache")
    corpus = data.load_builtin(cache)
    data.build_tokens(corpus, VOCAB, data.cache_folder(cache, corpus, VOCAB))
    return cache


@pytest.fixture(scope="session")
def trainer(token_cache) -> Runner:
    return Runner(token_cache)


@pytest.fixture(scope="session")
def adamw_runs(trainer, tmp_path_factory) -> dict:
    """20 AdamW steps: one process x batch 8, and FSDP2 on 2 ranks x batch 4 that also saves a
    checkpoint every 5 steps (keeping 3), evaluates at step 10 and exports the full model."""
    tmp = tmp_path_factory.mktemp("adamw")
    reference = trainer(tmp / "reference", *ADAMW, "--batch-size", "8", "--no-checkpoint")
    fsdp2 = trainer(tmp / "fsdp2", *ADAMW, "--fsdp", "2", "--checkpoint-interval", "5",
                    "--keep-checkpoints", "3", "--eval-interval", "10",
                    "--export-full", str(tmp / "fsdp2" / "full.pt"), nproc=2)
    return {"reference": reference, "fsdp2": fsdp2, "flags": ADAMW, "dir": tmp}
