"""The link check: its schedule, its result line, the judgement of slow links, and one real run."""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
from itertools import combinations

import pytest

from fsdpctl.errors import UsageError
from fsdpctl.hostcheck.links import judge_links, links_result, matrix_lines, plot_matrix
from fsdpctl.workload.links import _settings, identity, leaders, rounds
from tests.conftest import REPO


def synthetic(n: int, speed, seed: int = 0, jitter: float = 0.3) -> dict:
    """A result for ``n`` nodes where pair (a, b) runs at ``speed(a, b)`` GB/s, +-``jitter`` at random."""
    rng = random.Random(seed)
    pairs = [{"a": a, "b": b, "round": r, "seconds": 1.0, "gbps": speed(a, b) * rng.uniform(1 - jitter, 1 + jitter)}
             for r, round_pairs in enumerate(rounds(n)) for a, b in round_pairs]
    return {"backend": "nccl", "device": "cuda", "nodes": [{"node": i, "host": f"gpu{i:02d}"} for i in range(n)],
            "rounds": len(rounds(n)), "bytes": 256 << 20, "iters": 10, "pairs": pairs, "seconds": 9.0}


def throttled(slow: set[int], factor: float = 0.25, speed: float = 40.0):
    return lambda a, b: speed * (factor if a in slow or b in slow else 1.0)


@pytest.mark.parametrize("n", range(2, 18))
def test_schedule_plays_every_pair_once_in_disjoint_rounds(n):
    schedule = rounds(n)
    assert len(schedule) == (n - 1 if n % 2 == 0 else n)
    played = [pair for round_pairs in schedule for pair in round_pairs]
    assert sorted(played) == list(combinations(range(n), 2))
    for round_pairs in schedule:
        nodes = [node for pair in round_pairs for node in pair]
        assert len(nodes) == len(set(nodes))  # nobody plays twice in a round
        assert len(round_pairs) == n // 2  # at most one node sits a round out
    assert rounds(1) == [] and rounds(0) == []


def test_result_line_found_anywhere_in_a_line():
    result = synthetic(3, throttled(set()))
    lines = ["[rank0]:noise", f"[default0]:[rank0]:fsdpctl.links: {json.dumps(result)}", "fsdpctl.links: {broken"]
    assert links_result(lines) == result
    assert links_result(["fsdpctl.collectives: {}", "nothing"]) is None


def test_even_links_with_jitter_are_never_judged_slow():
    for n in (3, 4, 5, 8, 16):
        for seed in range(300):
            verdict = judge_links(synthetic(n, throttled(set()), seed=seed, jitter=0.3))
            assert verdict.ok and not verdict.slow_pairs and not verdict.slow_nodes, (n, seed, verdict.text)
            assert 28 <= verdict.reference_gbps <= 52
            assert any("look even" in line for line in verdict.text)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_one_throttled_node_is_named_alone(n):
    for seed in range(50):
        bad = seed % n
        verdict = judge_links(synthetic(n, throttled({bad}), seed=seed))
        assert [node for node, _ in verdict.slow_nodes] == [bad], (n, seed, verdict.text)
        assert {(a, b) for a, b, _, _ in verdict.slow_pairs} == {p for p in combinations(range(n), 2) if bad in p}
        assert all(ratio < 0.5 for _, _, _, ratio in verdict.slow_pairs)
        assert any(line.startswith(f"slow link: node {bad} (gpu{bad:02d})") for line in verdict.text)
        assert not any(line.startswith("slow pair") for line in verdict.text)  # explained by the node


def test_two_throttled_nodes_among_eight_are_both_named():
    for seed in range(50):
        verdict = judge_links(synthetic(8, throttled({2, 5}), seed=seed))
        assert [node for node, _ in verdict.slow_nodes] == [2, 5], (seed, verdict.text)
        assert len(verdict.slow_pairs) == 7 + 7 - 1


def test_one_bad_pair_names_the_pair_not_a_node():
    for n in (3, 8):
        verdict = judge_links(synthetic(n, lambda a, b: 5.0 if (a, b) == (0, 1) else 40.0, jitter=0.1))
        assert [(a, b) for a, b, _, _ in verdict.slow_pairs] == [(0, 1)] and verdict.slow_nodes == []
        assert any(line.startswith("slow pair: node 0 (gpu00) <-> node 1 (gpu01)") for line in verdict.text)


def test_a_slow_reading_the_second_measurement_clears_names_nobody_and_one_it_confirms_is_named_with_both():
    noisy = synthetic(4, lambda a, b: 5.0 if (a, b) == (0, 1) else 40.0, jitter=0.05)
    noisy["again"] = [{"a": 0, "b": 1, "seconds": 1.0, "gbps": 39.0}]  # measured again: the link is fine
    verdict = judge_links(noisy)
    assert verdict.ok and verdict.slow_nodes == []
    assert any(line.startswith("measured again: node 0 (gpu00) <-> node 1 (gpu01) read 5.") and
               line.endswith("then 39.00 GB/s: not slow (the first reading was noise)") for line in verdict.text)
    confirmed = synthetic(4, lambda a, b: 5.0 if (a, b) == (0, 1) else 40.0, jitter=0.05)
    confirmed["again"] = [{"a": 0, "b": 1, "seconds": 1.0, "gbps": 6.0}]
    verdict = judge_links(confirmed)
    assert [(a, b, round(g, 1)) for a, b, g, _ in verdict.slow_pairs] == [(0, 1, 6.0)]
    assert any(line.startswith("slow pair: node 0 (gpu00) <-> node 1 (gpu01): 6.00 GB/s") and
               "(measured twice: 5." in line and "and 6.00 GB/s)" in line for line in verdict.text)


def test_two_nodes_have_nothing_to_compare():
    verdict = judge_links(synthetic(2, throttled({1}, factor=0.01)))
    assert verdict.ok and verdict.slow_nodes == [] and verdict.reference_gbps > 0
    assert any("nothing to compare" in line for line in verdict.text)
    one = judge_links({"nodes": [{"node": 0, "host": "a"}], "pairs": [], "rounds": 0})
    assert one.reference_gbps is None and any("needs 2 nodes" in line for line in one.text)


def test_matrix_text_marks_slow_cells():
    result = synthetic(3, lambda a, b: 2.0 if 2 in (a, b) else 40.0, jitter=0.0)
    result["nodes"][2]["host"] = "a-very-long-hostname.example"
    lines = matrix_lines(result)
    assert len(lines) == 1 + 3 + 1 and lines[-1].startswith("* below 50%")
    assert lines[0].split() == ["GB/s", "gpu00", "gpu01", "a-very-long~"]
    assert lines[1].split() == ["gpu00", "-", "40.00", "2.00*"]
    assert lines[3].split() == ["a-very-long-hostname.example", "2.00*", "2.00*", "-"]
    assert len({len(line) for line in lines[:4]}) == 1  # the columns line up
    assert "*" not in "".join(matrix_lines(synthetic(3, throttled(set()))))


def test_plot_writes_a_png_with_its_figure_name(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: the report extra draws the PNG")
    path = plot_matrix(synthetic(4, throttled({3})), tmp_path / "plots")
    data = path.read_bytes()
    assert path.name == "links.png" and data.startswith(b"\x89PNG")
    assert b"fsdpctl:figure\x00links" in data and b"fsdpctl:series\x004" in data


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes ``import matplotlib`` raise ImportError
    with pytest.raises(UsageError, match="matplotlib is not installed") as caught:
        plot_matrix(synthetic(3, throttled(set())), tmp_path)
    assert "leave out --plot" in caught.value.hint


def test_hostcheck_module_never_imports_torch():
    code = "import sys, fsdpctl.hostcheck.links; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0


def test_leaders_and_identity(monkeypatch):
    everyone = [{"rank": r, "local_rank": r % 2, "node_rank": 2 - r // 2, "host": f"h{r // 2}", "leader": r % 2 == 0}
                for r in range(6)]
    assert [who["rank"] for who in leaders(everyone)] == [4, 2, 0]
    monkeypatch.setenv("GROUP_RANK", "3")
    monkeypatch.setenv("FSDPCTL_NODE_RANK", "1")
    monkeypatch.setenv("FSDPCTL_HOST", "node-b")
    assert identity(False, 9, 1) == {"rank": 9, "local_rank": 1, "node_rank": 1, "host": "node-b", "leader": False}
    assert identity(True, 9, 1) == {"rank": 9, "local_rank": 1, "node_rank": 9, "host": "node-b/1", "leader": True}
    monkeypatch.delenv("FSDPCTL_NODE_RANK")
    assert identity(False, 8, 0)["node_rank"] == 3


def test_sizes_and_defaults():
    def args(size: str = "", iters: int | None = None) -> argparse.Namespace:
        return argparse.Namespace(bytes=size, iters=iters)

    assert _settings(args(), "cpu") == (8 << 20, 5) and _settings(args(), "cuda") == (256 << 20, 10)
    assert _settings(args("64K", 2), "cpu") == (64 << 10, 2)
    for bad in (args("1X"), args("8M", 0)):
        with pytest.raises(ValueError):
            _settings(bad, "cpu")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_real_run_three_ranks_as_three_nodes():
    env = dict(os.environ, PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo",
               OMP_NUM_THREADS="1")
    env.pop("FSDPCTL_HOST", None)  # hosts are then named after this machine
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=3",
               f"--master_port={_free_port()}", "-m", "fsdpctl.workload.links", "--device", "cpu",
               "--bytes", "64K", "--iters", "2", "--per-rank"]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = links_result(proc.stdout.splitlines())
    assert result is not None, proc.stdout[-2000:]
    assert [node["node"] for node in result["nodes"]] == [0, 1, 2] and result["rounds"] == 3
    assert result["backend"] == "gloo" and result["bytes"] == 64 << 10 and result["iters"] == 2
    host = socket.gethostname()
    assert [node["host"] for node in result["nodes"]] == [f"{host}/{i}" for i in range(3)]
    assert sorted((p["a"], p["b"]) for p in result["pairs"]) == [(0, 1), (0, 2), (1, 2)]
    assert sorted(p["round"] for p in result["pairs"]) == [0, 1, 2]
    assert all(p["gbps"] > 0 and p["seconds"] > 0 for p in result["pairs"]) and result["seconds"] > 0
    assert len(matrix_lines(result)) >= 4 and judge_links(result).reference_gbps > 0
    assert isinstance(result["again"], list)  # the pairs that read slow, measured again (none, as a rule)
