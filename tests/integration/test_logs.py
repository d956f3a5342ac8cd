"""Every line a rank prints reaches the launcher and `fsdpctl logs`, on the namespace testbed: a flood
of 200,000 lines per rank read by a launcher that stalls longer than the node timeout, a rank that
prints bad bytes, NULs, progress bars and a 20 MB line, and a launcher killed mid-flood."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_launch import fsdpctl, processes_of, run, run_dir_of, wait_for_line, write_profile

pytestmark = pytest.mark.integration

LINES = 200_000
NODE_TIMEOUT = 8
PROGRAM = """\
import os, sys, time

rank = int(os.environ["RANK"])
if sys.argv[1] == "flood":  # numbered lines of 70 bytes, as fast as it can (pausing when asked)
    pause_every, pad = int(sys.argv[2]), "x" * 40
    for i in range(LINES):
        sys.stdout.write(f"flood rank={rank} seq={i:07d} {pad}\\n")
        if pause_every and i % pause_every == 0:
            sys.stdout.flush()
            time.sleep(0.05)
    sys.stdout.flush()
elif sys.argv[1] == "floodfail":  # rank 0 floods, then fails; rank 1 works on, saying so, until stopped
    if rank == 0:
        for i in range(LINES):
            sys.stdout.write(f"flood rank=0 seq={i:07d} {'x' * 40}\\n")
        sys.stdout.write(f"FAILING-AT {time.time():.3f}\\n")
        sys.stdout.flush()
        os._exit(3)
    for _ in range(1200):
        print(f"alive {time.time():.3f}", flush=True)
        time.sleep(0.1)
else:
    out = sys.stdout.buffer
    out.write(b"BEGIN\\nbad utf8 \\xff\\xfe here\\nnul \\x00 inside the line\\n")
    for percent in range(0, 101, 25):
        out.write(b"\\rprogress %d%%" % percent)
        out.flush()
        time.sleep(0.05)
    out.write(b"\\n" + b"y" * 20_000_000)
    out.flush()
    out.write(b"AFTER-BIG\\nEND\\n")
    out.flush()
""".replace("LINES", str(LINES))


def project(tmp_path: Path) -> Path:
    folder = tmp_path / "printer"
    folder.mkdir(exist_ok=True)
    (folder / "printer.py").write_text(PROGRAM)
    return folder


def seqs(text: str, rank: int) -> list[int]:
    return [int(n) for n in re.findall(rf"^\[\S+ r{rank}\] flood rank={rank} seq=(\d+) ", text, re.MULTILINE)]


def test_a_flood_arrives_whole_and_in_order_through_a_stalled_launcher(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    argv, env = fsdpctl(lab, tmp_path, "launch", "-p", str(profile), "--node-timeout", str(NODE_TIMEOUT),
                        "--code", str(project(tmp_path)), "--", "printer.py", "flood", "0")
    err_path = tmp_path / "launcher.err"
    with err_path.open("w") as err:
        launcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, cwd=tmp_path)
        # A terminal that stops reading for longer than the node timeout (a paused pager, ssh's
        # flow control): the launcher blocks on its output, the agents on the launcher, the ranks not.
        time.sleep(NODE_TIMEOUT + 5)
        out = launcher.stdout.read().decode("utf-8", "replace")
        code = launcher.wait(timeout=120)
    stderr = err_path.read_text()
    assert code == 0, stderr[-3000:]
    assert "was lost" not in stderr and "stopped answering" not in stderr
    for rank in (0, 1):
        assert seqs(out, rank) == list(range(LINES)), f"rank {rank}: {len(seqs(out, rank))} lines"
    run_dir = run_dir_of(tmp_path)
    logs = run(lab, tmp_path, "logs", run_dir.name, "--rank", "1")
    assert logs.returncode == 0, logs.stderr
    assert seqs(logs.stdout, 1) == list(range(LINES)) and not seqs(logs.stdout, 0)
    assert "[rank0]:flood" not in out, "one prefix per line: fsdpctl's, not torchrun's as well"


def test_a_node_that_fails_behind_a_flood_stops_the_others_at_once(lab, tmp_path):
    """A node's exit goes ahead of the log data still waiting for a slow terminal: the other node is
    stopped seconds after the failure, not once the failed node's whole flood has been shown; every
    line still arrives, and the failure is torchrun's, named."""
    profile = write_profile(lab, tmp_path)
    argv, env = fsdpctl(lab, tmp_path, "launch", "-p", str(profile), "--node-timeout", str(NODE_TIMEOUT),
                        "--code", str(project(tmp_path)), "--", "printer.py", "floodfail")
    err_path = tmp_path / "launcher.err"
    chunks = []
    with err_path.open("w") as err:
        launcher = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err, cwd=tmp_path)
        while chunk := launcher.stdout.read1(1 << 16):  # a terminal taking ~0.8 MB/s: the flood waits on disk
            chunks.append(chunk)
            time.sleep(0.08)
        code = launcher.wait(timeout=60)
    out, stderr = b"".join(chunks).decode("utf-8", "replace"), err_path.read_text()
    assert code == 3, stderr[-3000:] + out[-3000:]  # the preflight table, if it failed, is on stdout
    assert seqs(out, 0) == list(range(LINES)), f"{len(seqs(out, 0))} lines of rank 0"
    failed_at = float(re.search(r"FAILING-AT (\S+)", out).group(1))
    last_alive = max(float(t) for t in re.findall(r"r1\] alive (\S+)", out))
    # Showing rank 0's 14 MB here takes ~17 s; its exit comes ahead of what waits, and rank 1 is stopped.
    assert last_alive - failed_at < 12, (last_alive - failed_at, stderr[-2000:])
    assert f"FAILED: rank 0 (local rank 0) on {lab.hosts['n1'].address} (node 0) exited 3" in stderr, stderr[-3000:]
    assert "was lost" not in stderr and not processes_of(run_dir_of(tmp_path).name)


def test_bad_bytes_progress_bars_and_a_20_mb_line_are_shown_and_kept(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    # every rank's own copy of each line, as it came: the lines both ranks print alike are not folded here
    result = run(lab, tmp_path, "launch", "-p", str(profile), "--no-dedup", "--code", str(project(tmp_path)), "--",
                 "printer.py", "bad", timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    run_dir = run_dir_of(tmp_path)
    logs = run(lab, tmp_path, "logs", run_dir.name, "--no-dedup")
    for text in (result.stdout, logs.stdout):
        for rank in (0, 1):
            mine = [line.split("] ", 1)[1] for line in text.splitlines()
                    if line.startswith("[") and line.split("] ", 1)[0].endswith(f" r{rank}")]
            for marker in ("BEGIN", "bad utf8 \ufffd\ufffd here", "nul \\0 inside the line", "progress 100%", "END"):
                assert marker in mine, (rank, marker, mine[:12])
            big = [line for line in mine if line.endswith("AFTER-BIG")]
            assert len(big) == 1 and big[0].startswith("y" * 1000), (rank, [b[:100] for b in big])
            cut = re.search(r"\[\.\.\. fsdpctl: (\d+) bytes of this (\d+)-byte line cut; the whole line is in (\S+)",
                            big[0])
            # 20,000,009 bytes printed; torchrun may echo it in pieces, each with its own prefix.
            assert cut and 0 <= int(cut.group(2)) - 20_000_009 < 1000 and int(cut.group(1)) > 19_900_000, cut
            assert Path(cut.group(3)).name == f"node{0 if rank == 0 else 1}.log"
    # The copy here is the node's log, byte for byte (the 20 MB lines whole, as torchrun wrote them:
    # under load its tee may cut one into pieces, each after its own rank prefix).
    on_nodes = Path(json.loads((run_dir / "plan.json").read_text())["run_dir"])
    for node in (0, 1):
        copy = (run_dir / "logs" / f"node{node}.log").read_bytes()
        assert copy == (on_nodes / f"node{node}.log").read_bytes(), f"node {node}'s copy differs from its log"
        assert copy.count(b"y") >= 20_000_000 and copy.count(b"AFTER-BIG") == 1 and copy.count(b"BEGIN") == 1


def test_logs_completes_a_run_whose_launcher_was_killed_mid_flood(lab, tmp_path):
    profile = write_profile(lab, tmp_path)
    argv, env = fsdpctl(lab, tmp_path, "launch", "-p", str(profile), "--node-timeout", str(NODE_TIMEOUT),
                        "--code", str(project(tmp_path)), "--", "printer.py", "flood", "1000")
    with (tmp_path / "launcher.out").open("w") as out, (tmp_path / "launcher.err").open("w") as err:
        launcher = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=tmp_path)
    run_dir = run_dir_of(tmp_path)
    wait_for_line(tmp_path / "launcher.out", r"seq=0020000 ")
    launcher.send_signal(signal.SIGKILL)  # the launcher dies; the agents end the run after the node timeout
    launcher.wait(timeout=10)
    deadline = time.monotonic() + NODE_TIMEOUT + 30
    while processes_of(run_dir.name) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_of(run_dir.name)
    on_nodes = Path(json.loads((run_dir / "plan.json").read_text())["run_dir"])
    expected = {rank: (on_nodes / f"node{rank}.log").read_bytes() for rank in (0, 1)}
    assert all(len(data) > 20000 * 70 for data in expected.values())
    streamed = {rank: (run_dir / "logs" / f"node{rank}.log").stat().st_size for rank in (0, 1)}
    logs = run(lab, tmp_path, "logs", run_dir.name)
    assert logs.returncode == 0, logs.stderr
    for rank in (0, 1):
        assert (run_dir / "logs" / f"node{rank}.log").read_bytes() == expected[rank]
        printed = expected[rank].count(b"flood rank=%d " % rank)
        assert seqs(logs.stdout, rank) == list(range(printed))
    print(f"\nkilled launcher: streamed {streamed} bytes before the kill; the nodes' logs hold "
          f"{ {r: len(d) for r, d in expected.items()} }; `logs` completed the copy")
