"""On-demand profiles (``fsdpctl profile``, ``launch --profile-steps``): a rank's session with the real
torch.profiler in this process (start, the steps recorded, missed, refused, a full disk, the cut), the
request through a real pipe, the merge of several ranks' traces and the summary's verdict."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time

import pytest
import torch

from fsdpctl.diagnose.trace_merge import RankTrace, linked_collectives, merge, with_step_marks
from fsdpctl.diagnose.trace_summary import intersection, self_times, summarize, union
from fsdpctl.errors import UsageError
from fsdpctl.node import profile_request, profiling
from fsdpctl.node.startup import sitecustomize


@pytest.fixture
def rank_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDPCTL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("FSDPCTL_HOST", "n7")
    monkeypatch.setattr(profiling, "_SESSION", None)
    return tmp_path


def status_of(run_dir, ident, rank=3):
    path = profiling.status_path(str(run_dir), ident, rank)
    return json.loads(open(path).read()) if os.path.exists(path) else None


def train_steps(first, last, work=lambda: torch.randn(64, 64) @ torch.randn(64, 64)):
    for number in range(first, last + 1):
        work()
        time.sleep(0.002)
        profiling.step_ended(number)


def wait_done(run_dir, ident, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = status_of(run_dir, ident)
        if status is not None:
            return status
        time.sleep(0.02)
    raise AssertionError("no status written")


def test_a_session_records_exactly_the_asked_steps_and_writes_its_trace_beside_a_status(rank_env):
    profiling.request(json.dumps({"id": "p1", "start": 5, "steps": 2}))
    train_steps(1, 8)
    status = wait_done(rank_env, "p1")
    assert status["state"] == "done" and status["rank"] == 3 and status["host"] == "n7", status
    assert [s["step"] for s in status["step_times"]] == [5, 6]
    assert status["unprofiled_step_s"] and status["arrived_at_step"] == 1
    trace = json.loads(gzip.decompress((rank_env / "profile" / "p1" / "rank3.json.gz").read_bytes()))
    ops = [e for e in trace["traceEvents"] if e.get("name") == "aten::mm"]
    assert len(ops) == 2, len(ops)  # steps 5 and 6 alone: the profiler ran from step 4's end to step 6's
    base = trace["baseTimeNanoseconds"]
    first = status["step_times"][0]
    assert all(first["begin_ns"] <= base + e["ts"] * 1e3 <= status["step_times"][-1]["end_ns"] for e in ops)
    assert profiling._SESSION is None


def test_a_request_that_comes_after_its_start_step_says_missed_and_records_nothing(rank_env):
    train_steps(1, 3)
    profiling.request(json.dumps({"id": "late", "start": 3, "steps": 2}))
    train_steps(4, 5)
    status = status_of(rank_env, "late")
    assert status["state"] == "missed" and status["arrived_at_step"] == 4, status
    assert not (rank_env / "profile" / "late" / "rank3.json.gz").exists()


def test_a_program_that_runs_its_own_profiler_is_left_alone_and_told(rank_env, capsys):
    profiling.request(json.dumps({"id": "own", "start": 3, "steps": 1}))
    with torch.profiler.profile() as theirs:
        train_steps(1, 4)
    status = status_of(rank_env, "own")
    assert status["state"] == "refused" and "its own torch profiler" in status["why"]
    assert any(e.name == "aten::mm" for e in theirs.events())  # theirs recorded as if ours were not there
    assert "fsdpctl: profile: rank 3: refused" in capsys.readouterr().err


def test_a_trace_that_cannot_be_written_fails_with_its_reason_and_the_program_goes_on(rank_env, monkeypatch):
    def full(self, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", full)
    profiling.request(json.dumps({"id": "full", "start": 2, "steps": 1}))
    train_steps(1, 4)
    status = wait_done(rank_env, "full")
    assert status["state"] == "failed" and "No space left on device" in status["why"], status


def test_a_trace_over_its_cap_keeps_its_earliest_events_and_says_how_many():
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}]
    events += [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1, "args": {"n": os.urandom(8).hex()}}
               for i in range(4000)]
    text = json.dumps({"traceEvents": events}).encode()
    packed, cut = profiling._cut(text, 30_000)
    assert len(packed) <= 30_000 and 0 < cut["events_kept"] < 4000 and cut["events"] == 4000
    kept = json.loads(gzip.decompress(packed))["traceEvents"]
    assert kept[0]["ph"] == "M" and [e["ts"] for e in kept[1:]] == list(range(cut["events_kept"]))


def test_a_request_is_read_strictly():
    for bad in ('{"id": "../x", "start": 3, "steps": 1}', '{"id": "a", "start": 0, "steps": 1}',
                '{"id": "a", "start": 3, "steps": 101}', "[1]"):
        with pytest.raises(ValueError):
            profiling.parse_request(bad)
    assert profiling.chosen("auto", 5, 16) is False and profiling.chosen("auto", 15, 16)
    assert profiling.chosen("auto", 5, 8) and profiling.chosen("1,5", 5, 64) and not profiling.chosen("1,5", 6, 64)


def test_the_request_goes_through_the_ranks_pipe_to_its_hook_thread(rank_env, monkeypatch):
    (rank_env / "flight").mkdir()
    pipe = rank_env / "flight" / "rank3.trigger"
    os.mkfifo(pipe)
    reader = threading.Thread(target=sitecustomize._serve_flight_dumps, args=(str(pipe), "3"), daemon=True)
    reader.start()
    text = json.dumps({"id": "piped", "start": 9, "steps": 2})
    assert profile_request.write_pipe(str(pipe), profile_request.MESSAGE + text.encode()) is None
    deadline = time.monotonic() + 5
    while profiling._SESSION is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert profiling._SESSION is not None and profiling._SESSION.start == 9
    assert not (rank_env / "flight" / "rank3.trigger.done").exists()  # no flight dump was asked


def test_nobody_reading_the_pipe_is_said_after_the_patience(tmp_path):
    pipe = tmp_path / "rank0.trigger"
    os.mkfifo(pipe)
    began = time.monotonic()
    assert profile_request.write_pipe(str(pipe), b"profile {}", patience_s=0.2) == "No such device or address"
    assert time.monotonic() - began >= 0.2


# ---- the launcher's side: merge and summary ------------------------------------------------------

def rank_trace(rank, host, offset_ns, compute_us, comm_us, base_ns=1_000_000_000_000_000_000):
    """A trace of two 10 ms steps on one rank: its mm operators (``compute_us`` each step) inside an autograd
    wrapper, then c10d's call and gloo's range for ``comm_us``; its node's clock ``offset_ns`` ahead."""
    events = [{"ph": "M", "name": "process_name", "pid": 100 + rank, "tid": 0, "args": {"name": "python"}}]
    steps = []
    for i, step in enumerate((5, 6)):
        begin = i * 10_000.0
        events += [{"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0",
                    "pid": 100 + rank, "tid": 7, "ts": begin, "dur": 9_000.0},
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100 + rank, "tid": 7, "ts": begin,
                    "dur": compute_us},
                   {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 100 + rank, "tid": 7,
                    "ts": begin + compute_us, "dur": 50.0},
                   {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 100 + rank, "tid": 9,
                    "ts": begin + compute_us, "dur": comm_us}]
        steps.append({"step": step, "begin_ns": base_ns + int(begin * 1e3) + offset_ns,
                      "end_ns": base_ns + int((begin + 10_000) * 1e3) + offset_ns})
    trace = {"traceEvents": events, "baseTimeNanoseconds": base_ns + offset_ns}
    return RankTrace(rank, host, trace, {"step_times": steps, "rank": rank}, offset_ns, 1000)


def test_the_merge_puts_every_rank_on_the_launchers_clock_marks_the_steps_and_links_collectives():
    slow = rank_trace(1, "n2", offset_ns=250_000_000, compute_us=8_000.0, comm_us=500.0)
    fast = rank_trace(0, "n1", offset_ns=0, compute_us=2_000.0, comm_us=6_500.0)
    merged = merge([slow, fast], {"run_id": "r"})
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert names == {0: "rank 0 (n1)", 16: "rank 1 (n2)"}
    mm = sorted((e["pid"], e["ts"]) for e in events if e.get("name") == "aten::mm")
    # the 250 ms its node's clock runs ahead is taken off: both ranks' steps start together
    assert mm == [(0, 0.0), (0, 10_000.0), (16, 0.0), (16, 10_000.0)]
    steps = sorted((e["pid"], e["name"], e["ts"]) for e in events if e.get("cat") == "fsdpctl_step")
    assert steps == [(0, "step 5", 0.0), (0, "step 6", 10_000.0), (16, "step 5", 0.0), (16, "step 6", 10_000.0)]
    assert linked_collectives(merged) == 2  # allreduce #1 and #2, each across both ranks
    flows = [e for e in events if e.get("cat") == "fsdpctl_collective"]
    assert sorted(e["ph"] for e in flows) == ["f", "f", "s", "s"]
    assert merged["fsdpctl"]["ranks"][1]["clock_offset_ns"] == 250_000_000


def test_the_summary_names_the_rank_slow_in_compute_and_the_operator_where_its_time_goes():
    ranks = [rank_trace(0, "n1", 0, 2_000.0, 6_500.0), rank_trace(1, "n2", 0, 8_000.0, 500.0),
             rank_trace(2, "n3", 0, 2_100.0, 6_400.0)]
    summary = summarize(ranks)
    by_rank = {r["rank"]: r for r in summary["ranks"]}
    assert by_rank[1]["compute_ms"] == pytest.approx(8.0) and by_rank[0]["compute_ms"] == pytest.approx(2.0)
    assert by_rank[0]["comm_ms"] == pytest.approx(6.5) and by_rank[0]["idle_ms"] == pytest.approx(1.5)
    assert summary["straggler"] == 1 and summary["median_rank"] == 2
    assert summary["operators"][0]["name"] == "aten::mm" and summary["operators"][0]["extra_ms"] == pytest.approx(5.9)
    assert summary["verdict"].startswith("rank 1 (n2) is the straggler: its compute takes 3.81x the median rank's")
    even = summarize([rank_trace(0, "n1", 0, 2_000.0, 1.0), rank_trace(1, "n2", 0, 2_100.0, 1.0)])
    assert even["straggler"] is None and even["verdict"].startswith("ranks even")
    # two ranks: the faster is the yardstick, however the float distances to their mean round
    pair = summarize([rank_trace(0, "n1", 0, 739.0, 1.0), rank_trace(1, "n2", 0, 2_522.0, 1.0)])
    assert pair["straggler"] == 1 and pair["median_rank"] == 0, pair["verdict"]


def test_the_rank_copies_carry_profiler_step_marks_on_the_training_thread():
    marked = with_step_marks(rank_trace(0, "n1", 0, 2_000.0, 10.0))
    steps = [e for e in marked["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#")]
    assert [(e["name"], e["tid"], e["ts"], e["dur"]) for e in steps] == [("ProfilerStep#5", 7, 0.0, 10_000.0),
                                                                         ("ProfilerStep#6", 7, 10_000.0, 10_000.0)]


def test_intervals_and_self_times():
    assert union([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert intersection([(0, 3), (5, 7)], [(2, 6)]) == [(2, 3), (5, 6)]
    times = self_times([{"name": "outer", "ts": 0, "dur": 10}, {"name": "inner", "ts": 2, "dur": 3},
                        {"name": "inner", "ts": 6, "dur": 1}, {"name": "next", "ts": 12, "dur": 2}])
    assert times == {"outer": 6, "inner": 4, "next": 2}


def test_launch_flags_become_the_ranks_variables_and_bad_ones_one_line():
    from fsdpctl.cli.launch import profile_env_items

    assert profile_env_items("10-12", "all") == ["FSDPCTL_PROFILE_STEPS=10-12", "FSDPCTL_PROFILE_RANKS=all"]
    for steps, ranks in (("1-3", "all"), ("5-4", "all"), ("2-200", "all"), ("x", "all"), ("3-4", "zero")):
        with pytest.raises(UsageError):
            profile_env_items(steps, ranks)


def test_on_a_gpu_the_kernels_decide_compute_communication_their_overlap_and_idle():
    """Two 10 ms steps: a compute kernel 0-6 ms, an NCCL kernel 4-8 ms on another stream; 2 ms idle."""
    base = 1_000_000_000_000_000_000
    events, steps = [], []
    for i, step in enumerate((7, 8)):
        t = i * 10_000.0
        events += [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 5, "tid": 5, "ts": t, "dur": 100.0},
                   {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": t,
                    "dur": 6_000.0},
                   {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "pid": 0, "tid": 20,
                    "ts": t + 4_000.0, "dur": 4_000.0,
                    "args": {"Collective name": "_allgather_base", "Process Group Name": "0", "Seq": i}}]
        steps.append({"step": step, "begin_ns": base + int(t * 1e3), "end_ns": base + int((t + 10_000) * 1e3)})
    trace = RankTrace(0, "g1", {"traceEvents": events, "baseTimeNanoseconds": base}, {"step_times": steps})
    [only] = summarize([trace])["ranks"]
    assert only["device"] == "gpu"
    assert (only["compute_ms"], only["comm_ms"], only["overlap_ms"], only["idle_ms"]) == (6.0, 4.0, 2.0, 2.0)
    assert list(only["operators_ms"])[:2] == ["sm90_xmma_gemm_bf16", "ncclDevKernel_AllGather_RING_LL"]
    other = RankTrace(1, "g2", {"traceEvents": events, "baseTimeNanoseconds": base}, {"step_times": steps})
    assert linked_collectives(merge([trace, other])) == 2  # by process group and sequence number


def test_the_node_command_hands_the_request_to_the_run_copy_of_fsdpctl_quoted():
    from fsdpctl.backends.nodes.commands import profile_request_command

    request = json.dumps({"id": "p", "start": 9, "steps": 3})
    command = profile_request_command("~/w/runs/r1", "r1", "/opt/py/bin/python", '"$SLURM_NODEID"', ranks="0,3",
                                      request=request)
    assert command.startswith('cd "$HOME"/w/runs/r1 && PYTHONPATH=pkg /opt/py/bin/python '
                              '-m fsdpctl.node.profile_request r1 ')
    assert '--node-rank "$SLURM_NODEID" --ranks 0,3 --request \'{"id": "p", "start": 9, "steps": 3}\'' in command


def test_a_clock_offset_within_its_measurements_error_is_not_taken_off():
    from fsdpctl.api.tracing import applied_offset

    # the testbed's nodes share one clock: 63 ms measured, the round trip's half 64 ms (a lopsided SSH exec)
    assert applied_offset({"offset_ns": 62_964_637, "error_ns": 63_603_072}) == 0
    assert applied_offset({"offset_ns": -2_500_000_000, "error_ns": 40_000_000}) == -2_500_000_000
    assert applied_offset({"error": "unreachable"}) == 0
