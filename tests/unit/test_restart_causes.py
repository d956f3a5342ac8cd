"""A restart follows the failure's cause: what each failure is taken for, a program error that repeats
the attempt before it, the causes a profile names, exit codes that always restart, the hourly limit."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from fsdpctl.api.restart_causes import cause_of, judge
from fsdpctl.errors import ProfileError
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.profiles.restart_spec import RestartSpec
from fsdpctl.rundir.state import Failure

NOW = datetime(2026, 11, 28, 12, 0, 0)
DEFAULT = RestartSpec()


def exited(code: int = 1, *, signal: int | None = None, error: str | None = None, lines: tuple[str, ...] = (),
           **fields) -> Failure:
    return Failure(kind="exit", host="n2", node_rank=1, rank=1, exit_code=code, signal=signal, error=error,
                   last_lines=lines, **fields)


@pytest.mark.parametrize(("failure", "hardware", "cause"), [
    (Failure(kind="lost", host="n2", node_rank=1, exit_code=255, detail="nothing heard"), {}, "lost"),
    (Failure(kind="hang", host=None, node_rank=None, exit_code=124, detail="no progress"), {}, "hang"),
    (exited(error="torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
                  "exited or there was a network error, NCCL version 2.27.5"), {}, "transport"),
    (exited(134, signal=6, lines=("[E ProcessGroupNCCL.cpp] Watchdog caught collective operation timeout",
                                   "terminate called after throwing an instance of 'c10::DistBackendError'")),
     {}, "transport"),
    (exited(error="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                  "[10.0.0.1]:43211"), {}, "transport"),
    (exited(lines=("a peer went away",), peer_gone=True), {}, "transport"),
    (exited(error="RuntimeError: CUDA error: an illegal memory access"), {"n2": "Xid 79: fallen off the bus"},
     "hardware"),
    (exited(137, signal=9), {}, "signal"),
    (exited(143, signal=15), {}, "signal"),
    (exited(143, signal=15, in_shutdown=True), {}, "program"),  # it died in Python's shutdown, its work done
    (exited(139, signal=11, lines=("Fatal Python error: Segmentation fault",)), {}, "program"),
    (exited(error="ValueError: bad batch at step 5"), {}, "program"),
    (exited(3, lines=("rank 1 failing on purpose",)), {}, "program"),
])
def test_each_failure_is_taken_for_its_cause(failure, hardware, cause):
    assert cause_of(failure, DEFAULT, hardware) == cause


def test_a_program_error_that_repeats_the_attempt_before_it_at_the_same_step_ends_the_run():
    failure = exited(error="ValueError: bad batch at step 5")
    first = judge(failure, DEFAULT, hardware={}, step=5, before=None, restarted_at=[], now=NOW)
    assert first.restart and first.cause == "program" and first.step == 5
    assert first.why == "a program error (rank 1 on n2 exited 1)"
    again = judge(failure, DEFAULT, hardware={}, step=5, before=first.to_json(), restarted_at=[NOW], now=NOW)
    assert not again.restart
    assert again.why == ("not restarted: a program error (rank 1 on n2 exited 1) repeats the attempt before it at "
                         "step 5; a restart would fail the same way")
    # the same error further on made progress: worth another try; another error is another failure
    assert judge(failure, DEFAULT, hardware={}, step=9, before=first.to_json(), restarted_at=[NOW], now=NOW).restart
    other = exited(error="KeyError: 'x'")
    assert judge(other, DEFAULT, hardware={}, step=5, before=first.to_json(), restarted_at=[NOW], now=NOW).restart
    # with no step known on either side, the same exit and last line is the same failure
    quiet = exited(3, lines=("loading", "[rank1]:rank 1 failing on purpose", ""))
    once = judge(quiet, DEFAULT, hardware={}, step=None, before=None, restarted_at=[], now=NOW)
    assert once.signature == "exit 3: rank 1 failing on purpose"
    assert not judge(quiet, DEFAULT, hardware={}, step=None, before=once.to_json(), restarted_at=[], now=NOW).restart


def test_a_lost_node_restarts_however_often_it_repeats():
    lost = Failure(kind="lost", host="n2", node_rank=1, exit_code=255, detail="nothing heard")
    first = judge(lost, DEFAULT, hardware={}, step=5, before=None, restarted_at=[], now=NOW)
    assert judge(lost, DEFAULT, hardware={}, step=5, before=first.to_json(), restarted_at=[NOW], now=NOW).restart


def test_the_causes_a_profile_names_and_its_exit_codes():
    spec = RestartSpec(causes=("lost", "hang"), exit_codes=(75,))
    error = judge(exited(error="ValueError: x"), spec, hardware={}, step=3, before=None, restarted_at=[], now=NOW)
    assert not error.restart
    assert error.why == "not restarted: a program error (rank 1 on n2 exited 1), and restart.causes is lost, hang"
    asked = judge(exited(75), spec, hardware={}, step=3, before=None, restarted_at=[], now=NOW)
    assert asked.restart and asked.cause == "exit_code"
    # an exit code the program gives to be run again restarts every time, repeated or not
    assert judge(exited(75), spec, hardware={}, step=3, before=asked.to_json(), restarted_at=[], now=NOW).restart
    killed = judge(exited(137, signal=9), spec, hardware={}, step=3, before=None, restarted_at=[], now=NOW)
    assert not killed.restart and killed.cause == "signal"


def test_restarts_per_hour():
    spec = RestartSpec(per_hour=2)
    lost = Failure(kind="lost", host="n2", node_rank=1, exit_code=255, detail="nothing heard")
    hour_ago = [NOW - timedelta(minutes=61), NOW - timedelta(minutes=50)]
    assert judge(lost, spec, hardware={}, step=1, before=None, restarted_at=hour_ago, now=NOW).restart
    full = judge(lost, spec, hardware={}, step=1, before=None, restarted_at=[*hour_ago, NOW - timedelta(minutes=5)],
                 now=NOW)
    assert not full.restart
    assert full.why == ("not restarted: a lost node (n2 (node 1) was lost); 2 restart(s) in the last hour "
                        "(restart.per_hour 2)")


def test_a_profile_restart_section_is_read_and_checked():
    base = "name: x\nbackend: local\nhosts: [localhost]\nmax_restarts: 3\n"
    profile = parse_profile(base + "restart:\n  causes: [lost, hang]\n  exit_codes: [75]\n  per_hour: 4\n", "p.yaml")
    assert profile.restart == RestartSpec(causes=("lost", "hang"), exit_codes=(75,), per_hour=4)
    assert parse_profile(base, "p.yaml").restart == DEFAULT
    for section, said in (("causes: [lost, oops]", "restart.causes[1]: 'oops' is not one of lost, hang"),
                          ("causes: [lost, lost]", "restart.causes: names a cause twice"),
                          ("exit_codes: [0]", "restart.exit_codes[0]: 0 is outside 1-255"),
                          ("per_hour: 0", "restart.per_hour: 0 is outside 1-1000")):
        with pytest.raises(ProfileError) as raised:
            parse_profile(base + "restart:\n  " + section + "\n", "p.yaml")
        assert str(raised.value).startswith("p.yaml:6: " + said), raised.value
