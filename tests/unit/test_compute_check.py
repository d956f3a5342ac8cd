"""The compute check: reading its result line, naming slow ranks and nodes, and one real run."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fsdpctl.hostcheck.compute import RATIO, compute_result, judge_compute, table_lines

REPO = Path(__file__).resolve().parents[2]
H100 = "NVIDIA H100 80GB HBM3"


def make_result(tflops: list[float], per_node: int = 8, names: dict[int, str] | None = None,
                device: str = "cuda") -> dict:
    """A rank 0 result as the workload prints it, ``per_node`` ranks on each host n0, n1..."""
    ranks = [{"rank": i, "local_rank": i % per_node, "node": i // per_node, "host": f"n{i // per_node}",
              "device_name": (names or {}).get(i, H100 if device == "cuda" else "cpu"), "tflops": t,
              "gflops": t * 1e3, "matmuls": int(t), "seconds": 1.5} for i, t in enumerate(tflops)]
    return {"backend": "nccl" if device == "cuda" else "gloo", "device": device, "dtype": "bfloat16",
            "size": 8192, "seconds": 1.5, "ranks": ranks}


def test_result_line_found_anywhere_in_a_line():
    result = make_result([760.0, 750.0])
    lines = ["W1121 torchrun noise", f"[rank0]:fsdpctl.compute: {json.dumps(result)}",
             "fsdpctl.compute: {not json", "fsdpctl.compute: [1, 2]"]
    assert compute_result(lines) == result
    assert compute_result(["no result here", "fsdpctl.collectives: {}"]) is None


def test_even_ranks_with_jitter_name_nobody():
    rng = random.Random(1234)
    for trial in range(400):
        world = rng.choice([2, 3, 4, 5, 8, 16, 32, 64])
        per_node = rng.choice([1, 2, 4, 8])
        verdict = judge_compute(make_result([760 * rng.uniform(0.92, 1.08) for _ in range(world)], per_node))
        assert verdict.ok and not verdict.slow_ranks and not verdict.slow_nodes, (trial, verdict.text)
        assert verdict.text == [line for line in verdict.text if line.startswith("all ")]


def test_one_slow_rank_among_eight_is_named():
    tflops = [760, 770, 755, 765, 758, 312, 762, 768]
    verdict = judge_compute(make_result(tflops, per_node=4))
    assert [s[0] for s in verdict.slow_ranks] == [5]
    rank, host, local, value, ratio = verdict.slow_ranks[0]
    assert (host, local, value) == ("n1", 1, 312) and ratio == pytest.approx(312 / 761, abs=1e-3)
    assert verdict.slow_nodes == [] and not verdict.ok
    assert verdict.text == ["rank 5 (GPU 1 on n1) at 0.41x the median (312 vs 761 TFLOP/s)"]


def test_a_whole_slow_node_is_named_as_a_node():
    rng = random.Random(7)
    tflops = [760 * rng.uniform(0.95, 1.05) for _ in range(16)]
    for rank in range(8, 12):  # node 2 of 4 nodes, 4 ranks each
        tflops[rank] *= 0.5
    verdict = judge_compute(make_result(tflops, per_node=4))
    assert [s[0] for s in verdict.slow_ranks] == [8, 9, 10, 11]
    assert verdict.slow_nodes == [(2, "n2")]
    assert verdict.text[0].startswith("node 2 (n2): all 4 rank(s) slow, at 0.5")
    assert sum(line.startswith("rank ") for line in verdict.text) == 4


def test_one_slow_gpu_does_not_make_its_node_slow():
    verdict = judge_compute(make_result([760, 760, 300, 760, 760, 760, 760, 760], per_node=4))
    assert [s[0] for s in verdict.slow_ranks] == [2] and verdict.slow_nodes == []


def test_one_rank_has_nothing_to_compare():
    verdict = judge_compute(make_result([760.0]))
    assert verdict.median_tflops == 760 and verdict.ok
    assert verdict.text == ["1 rank only (GPU 0 on n0, 760 TFLOP/s): nothing to compare it with"]
    assert judge_compute({"ranks": []}).median_tflops is None


def test_mixed_device_names_get_a_line():
    verdict = judge_compute(make_result([760, 760, 760, 300], per_node=4, names={3: "NVIDIA A100-SXM4-80GB"}))
    assert verdict.mixed_hardware and not verdict.ok
    assert [s[0] for s in verdict.slow_ranks] == [3]
    assert any(line.startswith("mixed hardware: rank 3 (GPU 3 on n0) on NVIDIA A100-SXM4-80GB, 3 rank(s) on "
                               + H100) for line in verdict.text)


def test_most_ranks_slow_shows_the_fast_ones():
    # 2 of 3 nodes slow: the median is slow too, so the healthy node stands out above it instead.
    verdict = judge_compute(make_result([760] * 4 + [380] * 8, per_node=4))
    assert verdict.slow_ranks == []
    assert verdict.text[0].startswith("rank(s) 0, 1, 2, 3 run up to 2.00x the median")


def test_cpu_figures_read_in_gflops_and_table():
    result = make_result([0.093, 0.094, 0.05], per_node=3, device="cpu")
    verdict = judge_compute(result)
    assert verdict.text == ["rank 2 (local rank 2 on n0) at 0.54x the median (50.0 vs 93.0 GFLOP/s)"]
    table = table_lines(result)
    assert table[0].split() == ["rank", "host", "local", "device", "TFLOP/s", "x", "median"]
    assert table[3].split() == ["2", "n0", "2", "cpu", "0.05", "0.54", "slow"]
    assert len(table) == 4 and RATIO == 0.8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.workload
def test_real_run_on_two_cpu_ranks():
    env = dict(os.environ, PYTHONPATH=str(REPO), GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           "-m", "fsdpctl.workload.compute_check", "--device", "cpu", "--seconds", "0.5", "--size", "128"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = compute_result(proc.stdout.splitlines())
    assert result is not None, proc.stdout[-3000:]
    assert (result["device"], result["dtype"], result["size"], result["backend"]) == ("cpu", "float32", 128, "gloo")
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for rank in result["ranks"]:
        assert rank["tflops"] > 0 and rank["matmuls"] > 0 and rank["seconds"] >= 0.5
        assert rank["device_name"] == "cpu" and rank["node"] == 0
    assert judge_compute(result).median_tflops > 0
