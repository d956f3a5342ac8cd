"""``fsdpctl top``'s screen drawn from snapshots: it fits 80x24 whatever the run's size (a 128-rank run
folds its ranks by node and its quiet nodes into one line, the troubled ones first), names the slowed
GPU on its node and the straggler with its cause, filters the lines by rank, and prints without colour."""

from __future__ import annotations

import dataclasses
import time

from fsdpctl.cli.top_view import duration, gpus_text, plain, render, sparkline
from fsdpctl.live.snapshot import GpuNow, HostsNow, NodeNow, Progress, RankNow, Snapshot
from fsdpctl.rundir.lines import LogLine
from fsdpctl.rundir.state import RunState
from fsdpctl.rundir.status import AttemptInfo, Replacement


def big_run(slowed_node: int = 5) -> Snapshot:
    nodes, ranks = [], []
    for n in range(16):
        gpus = tuple(GpuNow(index=g, bus_id=f"00000000:{0x18 + g:02X}:00.0", sm_mhz=1095.0 if (n, g) == (slowed_node, 3)
                            else 1980.0, sm_max_mhz=1980.0, util_pct=98.0, mem_mib=61000.0, mem_total_mib=81559.0,
                            temp_c=64.0, power_w=690.0,
                            reasons=("HW slowdown",) if (n, g) == (slowed_node, 3) else ()) for g in range(8))
        nodes.append(NodeNow(node_rank=n, host=f"gpu-node-{n:03d}.cluster.example", state="running",
                             ranks=f"{8 * n}-{8 * n + 7}", step=1200, gpus=gpus, sampled_at=time.time()))
        for g in range(8):
            rank = 8 * n + g
            slow = 1.8 if (n, g) == (slowed_node, 3) else 1.0
            ranks.append(RankNow(rank=rank, node_rank=n, host=nodes[-1].host, local_rank=g, step=1200,
                                 compute_s=0.2 * slow, comm_s=0.05, data_s=0.001, wall_s=0.3,
                                 recent_compute_s=tuple(0.2 * slow for _ in range(12))))
    progress = Progress(run_id="big-20261126-120000-abcd", profile="big", backend="ssh", state="running", attempt=2,
                        step=1200, total_steps=5000, tokens_per_s=3.2e6, loss=3.1234, val_loss=3.2,
                        mfu=0.41, eta_s=7260, elapsed_s=3600, live=True,
                        loss_history=tuple((s, 5 - s / 1000) for s in range(0, 1200, 10)),
                        tokens_history=tuple((s, 3.2e6) for s in range(0, 1200, 10)), metrics=True)
    logs = tuple(LogLine(0, nodes[0].host, f"step={s} loss=3.1 <script>x</script>", 0) for s in range(50))
    return Snapshot(taken_at=time.time(), run=progress, nodes=tuple(nodes), ranks=tuple(ranks),
                    straggler={"text": "straggler: rank 43 on gpu-node-005.cluster.example (node 5) computed 1.80x "
                                       "the other ranks' median in 12 of 12 windows; every rank waits for it",
                               "rank": 43, "cause": "GPU 3 on gpu-node-005: HW slowdown (in 12 of 12 samples)"},
                    attempts=(AttemptInfo(attempt=1, state=RunState.FAILED, ended_by="node 2 lost"),),
                    replacements=(Replacement("gpu-node-002.cluster.example", "gpu-node-016.cluster.example", "lost"),),
                    hosts=HostsNow(spares=("gpu-node-017",), excluded=({"host": "gpu-node-002", "reason": "lost"},)),
                    logs=logs)


def test_a_128_rank_run_fits_80x24_with_the_troubled_node_first_and_the_straggler_named():
    screen = render(big_run(), 80, 24)
    lines = screen.plain.split("\n")
    assert len(lines) == 24 and all(len(line) <= 80 for line in lines), [len(x) for x in lines]
    text = screen.plain
    first_node = next(i for i, line in enumerate(lines) if line.strip().startswith(("5 ", "0 ")))
    assert lines[first_node].split()[0] == "5"  # the node with the slowed GPU comes first
    assert "GPU 3 (00000000:1B:00.0) HW slowdown 1,095/1,980 MHz" in lines[first_node + 1]
    assert "more node(s)" in text
    assert "compute by node" in text and "n5 " in text  # 128 ranks folded by node
    assert "straggler: rank 43" in text and "cause: GPU 3 on gpu-node-005" in text
    assert "step 1,200/5,000" in text and "ETA 2h01m" in text and "MFU 41.0%" in text
    assert "gpu-node-016.cluster.example in the place of gpu-node-002.cluster.example" in text
    assert "8x 98% 1980/1980MHz 64C 5.5kW 60/80G" in text  # a node's GPUs whole in one cell
    assert lines[-1].strip().startswith("q quit")
    said = "goodput: ETTR 88.1%, strict 80.2% of 1.00 h; most lost to stood still, restarting (6.0%)"
    with_account = render(dataclasses.replace(big_run(), goodput=said), 80, 24).plain.split("\n")
    assert len(with_account) == 24 and any(line.startswith(said[:70]) for line in with_account)  # it fits still


def test_lines_of_one_rank_only_and_hostile_text_stays_text():
    snap = big_run()
    mixed = snap.logs + (LogLine(1, "gpu-node-001", "rank nine's line", 9),)
    snap = Snapshot(taken_at=snap.taken_at, run=snap.run, nodes=snap.nodes[:2], ranks=snap.ranks[:16], logs=mixed)
    only = render(snap, 100, 40, rank=9).plain
    assert "rank nine's line" in only and "<script>" not in only and "logs (rank 9)" in only
    everyone = plain(snap)
    assert "<script>x</script>" in everyone and "\x1b[" not in everyone  # no escape codes without a terminal


def test_small_pieces():
    assert [duration(s) for s in (None, 5, 125, 7260, 90000)] == ["-", "5s", "2m05s", "2h01m", "1d01h"]
    assert sparkline([1, 2, 3], 10) == "▁▄█" and sparkline([2, 2], 5) == "▄▄" and sparkline([], 3) == ""
    gpus = big_run().nodes[0].gpus
    assert gpus_text(gpus) == "8x 98% 1980/1980MHz 64C 5.5kW 60/80G"
    assert gpus_text(()) == "no GPU samples"


def test_an_elastic_run_short_of_a_node_says_so_with_what_it_cost():
    from fsdpctl.rundir.status import Recovery, Resize

    snap = dataclasses.replace(big_run(), replacements=(), resize=Resize(
        nodes=15, before=16, full=16, hosts=("gpu-node-002",), why="lost: nothing heard from it",
        batch="global batch 1024 kept: batch 8 x accumulation 8 per rank"),
        recovery=Recovery(stood_still_s=41.2, steps_redone=7, tok_s_before=3.2e6, tok_s_after=3.0e6))
    text = render(snap, 200, 40).plain
    assert ("elastic: runs on 15 of 16 nodes: gpu-node-002 out (lost: nothing heard from it); global batch 1024 "
            "kept") in text
    assert "stood still 41.2 s, 7 step(s) done again, 3,200,000 -> 3,000,000 tok/s" in text
