"""The estimate's trace process: a round of traces side by side in forked processes answers exactly
what one process tracing them one after another answers, a kept server answers round after round,
and a timeout ends the server and every trace it forked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsdpctl.workload.trace_process import MODULE, TraceServer, answers

pytestmark = pytest.mark.workload
REPO = str(Path(__file__).resolve().parents[2])
TINY = {"preset": "tiny", "vocab_size": 1024, "seq_len": 64, "batch_size": 4, "device": "cuda",
        "mixed_precision": "fp32"}
ROUND = [{**TINY, "world": 2, "sharding": "full"}, {**TINY, "world": 2, "sharding": "grad-op"},
         {**TINY, "world": 1, "activation_checkpointing": True}]
SAME = ("peak_bytes", "breakdown", "phase", "module", "batch_size", "params", "traced")


def in_group(group: int) -> list[int]:
    """The live (not zombie) processes of a process group."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(name))
    return found


def test_a_round_traced_side_by_side_answers_what_one_process_answers_in_order_round_after_round():
    # Held to one core, the one-shot process traces the round one after another, in itself.
    one_by_one = answers(subprocess.run(["taskset", "-c", "0", sys.executable, "-m", MODULE, json.dumps(ROUND)],
                                        capture_output=True, text=True, timeout=300, cwd=REPO).stdout)
    with TraceServer([REPO]) as server:
        first = answers(server.run(ROUND, 300).stdout)
        again = answers(server.run(list(reversed(ROUND)), 300).stdout)
    assert [a["request"] for a in first] == ROUND and [a["request"] for a in again] == list(reversed(ROUND))
    assert all(a["traced"] for a in first), first
    for mine, theirs in zip(first, one_by_one, strict=True):
        assert {k: mine.get(k) for k in SAME} == {k: theirs.get(k) for k in SAME}
    assert [a["peak_bytes"] for a in again] == [a["peak_bytes"] for a in reversed(first)]


def test_a_round_past_its_timeout_ends_the_server_and_every_trace_it_forked():
    big = [{**TINY, "preset": "gpt2-124m", "seq_len": 1024, "world": w, "batch_size": 32} for w in (1, 2, 4)]
    server = TraceServer([REPO])
    try:
        assert answers(server.run([{**TINY, "world": 1}], 300).stdout)[0]["traced"]  # torch is imported by now
        group = server._process.pid
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            server.run(big, 1.0)
        assert time.monotonic() - started < 10
        deadline = time.monotonic() + 5
        while in_group(group) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert in_group(group) == [] and server._process.poll() is not None
    finally:
        server.close()
