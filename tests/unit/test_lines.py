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
