"""From a node's log bytes to the lines shown: ranks, bad bytes, NULs, progress bars, huge lines and
torchrun's interleaved partial lines, whatever the chunks the bytes arrive in."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl.rundir.lines import HEAD_BYTES, MAX_LINE_BYTES, TAIL_BYTES, LineSplitter, LogLine

SAMPLE = (b"fsdpctl: node 0 of 2 on n1\n[rank0]:BEGIN\n[rank1]:bad utf8 \xff\xfe here\n[rank0]:nul \x00 inside\n"
          b"[rank0]:\rprogress 0%\rprogress 50%\rprogress 100%\r\n[rank0]:50%[rank1]:loss=2\n"
          b"[rank1]:flood se[rank0]:the rest of 50%\n[rank1]:q=7 x\n"
          b"[rank1]:" + b"y" * 100_000 + b"AFTER-BIG\n[rank0]:no newline at the end")


def split(data: bytes, sizes: list[int] | None = None) -> list[LogLine]:
    splitter, out, at = LineSplitter(0, "n1", "node0.log"), [], 0
    for size in sizes or [len(data)]:
        out += splitter.feed(data[at:at + size])
        at += size
    out += splitter.feed(data[at:]) + splitter.end()
    return out


def test_lines_are_made_readable_and_keep_their_rank():
    lines = split(SAMPLE)
    assert [(line.rank, line.text) for line in lines[:8]] == [
        (None, "fsdpctl: node 0 of 2 on n1"), (0, "BEGIN"), (1, "bad utf8 \ufffd\ufffd here"),
        (0, "nul \\0 inside"), (0, "progress 100%"), (1, "loss=2"), (0, "50%the rest of 50%"),
        (1, "flood seq=7 x")]
    big = lines[8]
    assert big.rank == 1 and big.text.startswith("y" * 100) and big.text.endswith("yyyAFTER-BIG")
    assert big.cut == 100_009 + len(b"[rank1]:") - HEAD_BYTES - TAIL_BYTES
    assert f"{big.cut} bytes of this 100009-byte line cut; the whole line is in node0.log" in big.text
    assert len(big.text.encode()) < MAX_LINE_BYTES + 200
    assert lines[9] == LogLine(0, "n1", "no newline at the end", 0)
    assert [str(line) for line in lines[:2]] == ["[n1] fsdpctl: node 0 of 2 on n1", "[n1 r0] BEGIN"]
    assert all(LogLine.of(0, "n1", line.stored()) == line._replace(cut=0) for line in lines)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40_000), max_size=12))
def test_any_chunking_gives_the_same_lines(sizes):
    assert split(SAMPLE, sizes) == split(SAMPLE)


def test_local_rank_0_names_its_nodes_global_ranks_and_status_reads_them(tmp_path):
    """The rank hook's line, as a real rank prints it under torchrun's prefix, read back the two ways
    status reads it: from a shown line (Slurm's node logs) and from a node's log file (a launcher's copy)."""
    import os
    import subprocess
    import sys

    from fsdpctl.rundir.lines import ranks_in_log, ranks_said
    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "fsdpctl" / "node" / "startup"), "RANK": "8", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "2", "FSDPCTL_NODE_RANK": "1", "FSDPCTL_RUN_DIR": str(tmp_path)}
    env.pop("FSDPCTL_RANK_HOOK_PID", None)
    said = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=60).stderr
    assert said == "fsdpctl: global ranks 8-11 on node 1 (torchrun group rank 2)\n"
    others = subprocess.run([sys.executable, "-c", "pass"], env={**env, "LOCAL_RANK": "1", "RANK": "9"},
                            capture_output=True, text=True, timeout=60).stderr
    assert others == ""  # one line per node, not per rank
    splitter = LineSplitter(1, "n2", "node1.log")
    [line] = splitter.feed(f"[rank8]:{said}".encode())
    assert ranks_said(line) == "8-11"
    assert ranks_said(LogLine(1, "n2", said.strip())) is None  # the node's own lines never count: a rank said it
    log = tmp_path / "node1.log"
    log.write_bytes(b"torchrun starting\n" + f"[rank8]:{said}".encode() + b"[rank8]:step=1 loss=2\n")
    assert ranks_in_log(log) == "8-11" and ranks_in_log(tmp_path / "missing.log") is None


def test_a_node_of_one_rank_says_its_one_global_rank(tmp_path):
    """One rank per node: ``global rank 1``, not ``global ranks 1-1``; read back as ``1`` both ways,
    as is the ``ranks 3-3`` that runs before wrote."""
    import os
    import subprocess
    import sys

    from fsdpctl.rundir.lines import ranks_in_log, ranks_said
    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO / "fsdpctl" / "node" / "startup"), "RANK": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "1", "FSDPCTL_NODE_RANK": "1", "FSDPCTL_RUN_DIR": str(tmp_path)}
    env.pop("FSDPCTL_RANK_HOOK_PID", None)
    said = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=60).stderr
    assert said == "fsdpctl: global rank 1 on node 1 (torchrun group rank 1)\n"
    [line] = LineSplitter(1, "n2", "node1.log").feed(f"[rank1]:{said}".encode())
    assert ranks_said(line) == "1"
    log = tmp_path / "node1.log"
    log.write_bytes(f"[rank1]:{said}".encode())
    assert ranks_in_log(log) == "1"
    older = "fsdpctl: global ranks 3-3 on node 3 (torchrun group rank 3)"
    assert ranks_said(LogLine(3, "n4", older, 3)) == "3"
    log.write_bytes(f"[rank3]:{older}\n".encode())
    assert ranks_in_log(log) == "3"
