"""Notices to people (a profile's ``notify``): the section read strictly, the sender's queue, retries
and single note against a real HTTP receiver on loopback and a dead port, the command target, and
secret URLs that never reach a file or a note."""

from __future__ import annotations

import json
import socket
import sys
import textwrap
import time

import pytest

from fsdpctl.errors import ProfileError, UsageError
from fsdpctl.notify.message import message, plain
from fsdpctl.notify.sender import Sender
from fsdpctl.notify.targets import AppriseTarget, CommandTarget, SendFailed, check_targets, targets_for
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.profiles.notify_spec import NEEDS_A_PERSON, NOTIFY_EVENTS, NotifySpec
from tests.testbed.webhook import Receiver

pytest.importorskip("apprise")


def profile(section: str):
    return parse_profile("name: t\nbackend: local\nnotify:\n" + textwrap.indent(textwrap.dedent(section), "  "),
                         "lab.yaml")


def test_the_section_reads_into_a_notify_spec_with_the_events_that_need_a_person_by_default():
    spec = profile("""\
        urls: [json://10.0.0.1:8080/hook]
        secrets: [SLACK_HOOK]
        command: [/usr/bin/page, --quiet]
    """).notify
    assert spec == NotifySpec(urls=("json://10.0.0.1:8080/hook",), secrets=("SLACK_HOOK",),
                              command=("/usr/bin/page", "--quiet"))
    assert spec.events == NEEDS_A_PERSON and "started" not in spec.events
    assert parse_profile("name: t\nbackend: local\n", "lab.yaml").notify is None


@pytest.mark.parametrize("section, where, words", [
    ("urls: [slack-hook]", "lab.yaml:4: notify.urls[0]:", "is not an apprise URL"),
    ("urls: [json://h/x]\nevents: [started, finish]", "lab.yaml:5: notify.events[1]:", "did you mean 'finished'?"),
    ("secrets: [my-hook]", "lab.yaml:4: notify.secrets[0]:", "'my-hook'"),
    ("urls: [json://h/x]\ntimeout: 0", "lab.yaml:5: notify.timeout:", "outside 1-300"),
    ("events: [failed]", "lab.yaml:4: notify.urls:", "no target"),
    ("url: [json://h/x]", "lab.yaml:4: notify.url:", "did you mean 'urls'?"),
])
def test_a_bad_section_is_one_line_naming_file_line_field_and_fix(section, where, words):
    with pytest.raises(ProfileError) as caught:
        profile(section)
    said = str(caught.value)
    assert "\n" not in said and said.startswith(where) and words in said, said


def test_a_secret_url_is_read_from_the_environment_and_named_without_its_value():
    spec = NotifySpec(secrets=("HOOK",))
    with pytest.raises(UsageError, match="notify.secrets: HOOK is not set in this environment"):
        targets_for(spec, {})
    [target] = check_targets(spec, {"HOOK": "json://127.0.0.1:9/tok-123456"})
    assert target.name == "secret HOOK" and "tok-123456" not in repr(target)
    with pytest.raises(UsageError, match=r"notify.secrets: HOOK: apprise has no service nope://"):
        check_targets(spec, {"HOOK": "nope://x/tok-123456"})


def test_notices_reach_a_receiver_in_order_as_apprise_json_with_the_event_first():
    with Receiver() as receiver:
        sender = Sender([AppriseTarget("urls[0]", f"json://127.0.0.1:{receiver.port}/hook")],
                        on_given_up=lambda *a: pytest.fail(f"given up: {a}"))
        for event in ("started", "failed", "finished"):
            sender.put(message(event, "lab-1", event, {"profile": "lab", "hosts": "n1,\x1b[31mn2\nforged: yes"}))
        sender.close()
        bodies = receiver.wait_for(3)
    assert [b["title"] for b in bodies] == [f"fsdpctl: run lab-1 {e}" for e in ("started", "failed", "finished")]
    assert bodies[1]["message"].splitlines() == ["event: failed", "profile: lab", "hosts: n1,?[31mn2 forged: yes"]
    assert {"version", "title", "message", "type"} <= set(bodies[0]) and receiver.paths == ["/hook"] * 3


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_dead_target_is_tried_three_times_noted_once_and_delays_neither_the_caller_nor_the_others():
    notes = []
    with Receiver() as receiver:
        dead = AppriseTarget("secret DEAD", f"json://127.0.0.1:{free_port()}/tok-abcdef",
                             ("tok-abcdef",))
        sender = Sender([dead, AppriseTarget("urls[0]", f"json://127.0.0.1:{receiver.port}/")],
                        on_given_up=lambda target, text: notes.append((target, text)), backoff=(0.2, 0.2))
        began = time.monotonic()
        for event in ("started", "failed", "finished"):
            sender.put(message(event, "lab-1", event, {}))
        assert time.monotonic() - began < 0.1, "put never waits for a send"
        assert len(receiver.wait_for(3, timeout=5)) == 3, "the live target is not held up by the dead one"
        time.sleep(2.0)
        sender.close(within=2.0)
    assert sender.counts["secret DEAD"] == {"sent": 0, "given_up": 3, "dropped": 0}
    [(target, text)] = notes
    assert target == "secret DEAD" and "not sent after 3 tries" in text and "tok-abcdef" not in text


def test_a_full_queue_drops_its_oldest_and_close_lets_go_within_its_bound():
    class Stuck:
        name = "stuck"

        def send(self, notice, timeout):
            time.sleep(30)

    notes = []
    sender = Sender([Stuck()], on_given_up=lambda target, text: notes.append(text), capacity=2)
    for i in range(5):
        sender.put(message("hang", "r", str(i), {}))
    began = time.monotonic()
    sender.close(within=0.5)
    assert time.monotonic() - began < 1.5
    assert sender.counts["stuck"]["dropped"] >= 2 and len(notes) == 1 and "did not answer" in notes[0]


def test_the_command_target_gets_the_notice_as_json_on_stdin_and_its_event_in_the_environment(tmp_path):
    out = tmp_path / "got.json"
    script = (f"import json, os, sys; d = json.load(sys.stdin); d['env'] = os.environ['FSDPCTL_NOTIFY_EVENT']; "
              f"open({str(out)!r}, 'w').write(json.dumps(d))")
    CommandTarget((sys.executable, "-c", script)).send(message("failed", "lab-1", "failed", {"exit_code": 137}), 10)
    got = json.loads(out.read_text())
    assert (got["event"], got["run_id"], got["exit_code"], got["env"]) == ("failed", "lab-1", 137, "failed")
    with pytest.raises(SendFailed, match="exit 3: no pager"):
        CommandTarget((sys.executable, "-c", "import sys; sys.exit('no pager') if 0 else (print('no pager', "
                       "file=sys.stderr), sys.exit(3))")).send(message("failed", "r", "x", {}), 10)


def test_plain_keeps_one_printable_line():
    assert plain("a\nb\x07c") == "a b?c" and len(plain("x" * 1000)) == 300


class Kept:
    """A target that keeps what it is sent (the seam between the notifier and the wire)."""

    name = "kept"

    def __init__(self):
        self.notices = []

    def send(self, notice, timeout):
        self.notices.append(notice)


def a_run(nodes: int, attempt: int = 1):
    from types import SimpleNamespace

    plan = SimpleNamespace(num_nodes=nodes, attempt=attempt, profile_name="lab", run_id="lab-1",
                           nodes=[SimpleNamespace(host=f"n{i + 1}") for i in range(nodes)])
    record = SimpleNamespace(started_at=None, created_at=None, attempt=attempt, notes=())
    return SimpleNamespace(plan=plan, record=record, root="/runs/lab-1", run_id="lab-1")


def test_the_notifier_names_each_event_from_the_api_s_events_and_the_training_rows():
    from fsdpctl.api.events import AttemptStarting, Emitter, HangSuspected, RunEnded
    from fsdpctl.api.notifying import Notifier
    from fsdpctl.rundir.state import Failure, Outcome, RunState

    kept, heard = Kept(), []
    notifier = Notifier(Emitter(heard.append), NotifySpec(command=("x",), events=NOTIFY_EVENTS), [kept])
    notifier.attempt_started(a_run(3), "started on 3 node(s)")
    now = time.time()
    notifier.row("train", {"step": 1, "loss": 8.3, "time": now, "tokens_per_s": 1000.0})
    notifier.row("train", {"step": 2, "loss": 8.1, "time": now, "straggler": "straggler: rank 2 computed 1.5x",
                           "straggler_at": {"rank": 2, "node": 2, "host": "n3"}})
    notifier.row("train", {"step": 3, "loss": 8.0, "time": now, "straggler": "straggler: rank 2 computed 1.5x",
                           "straggler_at": {"rank": 2, "node": 2, "host": "n3"}})
    notifier(HangSuspected("lab-1", 300.0, "rank 2 in all_reduce", True))
    failure = Failure(kind="exit", host="n3", node_rank=2, exit_code=137, rank=2, signal=9)
    notifier(RunEnded("lab-1", Outcome(exit_code=137, state=RunState.FAILED, first_failure=failure), "/runs/lab-1"))
    notifier(AttemptStarting("lab-1", 2, 3, 10, "rank 2 on n3 exited 137 (SIGKILL)"))
    notifier.attempt_started(a_run(2, attempt=2))
    notifier(AttemptStarting("lab-1", 3, 4, 20, "growing back to 3 nodes"))
    notifier.attempt_started(a_run(3, attempt=3))
    notifier.row("train", {"step": 40, "loss": 5.9, "time": time.time(), "tokens_per_s": 2000.0})
    notifier(RunEnded("lab-1", Outcome(exit_code=0, state=RunState.SUCCEEDED), "/runs/lab-1"))
    notifier.close()
    events = [n.event for n in kept.notices]
    assert events == ["started", "first_step", "straggler", "hang", "failed", "shrunk", "grown", "first_step",
                      "finished"], events
    by = {n.event: n for n in kept.notices}
    assert by["straggler"].title == "fsdpctl: run lab-1 has a straggler: rank 2 on n3"
    assert "first failure: rank 2 on n3 exited 137 (SIGKILL)" in by["failed"].body
    assert "nodes: 3 -> 2" in by["shrunk"].body
    assert by["grown"].title == "fsdpctl: run lab-1 grown to 3 nodes: attempt 3"
    assert "steps: 40" in by["finished"].body and by["finished"].level == "success"
    assert len(heard) == 5, "every event reaches the emitter it wraps"


def test_notify_test_says_per_target_what_came_back_and_exits_1_when_one_failed(tmp_path):
    from tests.conftest import REPO, run_cli

    profile = tmp_path / "lab.yaml"
    with Receiver() as receiver:
        profile.write_text(f"name: lab\nbackend: local\nnotify:\n  urls: [\"json://127.0.0.1:{free_port()}/x\"]\n"
                           f"  secrets: [LAB_HOOK]\n  timeout: 2\n")
        env = {"LAB_HOOK": f"json://127.0.0.1:{receiver.port}/hook/tok-5e5e5e", "PYTHONPATH": str(REPO)}
        done = run_cli("notify", "--test", "-p", str(profile), env=env)
        [body] = receiver.wait_for(1)
    lines = done.stdout.splitlines()
    assert done.returncode == 1 and lines[0].startswith("urls[0] json://127.0.0.1:") and "failed: " in lines[0]
    assert lines[1] == "secret LAB_HOOK: ok" and "tok-5e5e5e" not in done.stdout + done.stderr
    assert body["title"] == "fsdpctl: test notice (profile lab)" and receiver.paths == ["/hook/tok-5e5e5e"]
    missing = run_cli("notify", "--test", "-p", str(profile), env={"LAB_HOOK": ""})
    assert missing.returncode == 2
    assert "error: notify.secrets: LAB_HOOK is not set in this environment" in missing.stderr


def test_a_job_file_s_notify_takes_the_profile_s_place_and_its_follower_reads_it_back(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import fsdpctl
    from fsdpctl.api.notifying import notify_spec_of

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    profile = tmp_path / "lab.yaml"
    profile.write_text("name: lab\nbackend: local\nnproc_per_node: 1\nnotify:\n  urls: [json://a/b]\n")
    job = tmp_path / "nightly.yaml"
    job.write_text("name: nightly\ncommand: [train.py]\nnotify:\n  command: [/bin/true]\n  events: [failed]\n")
    prepared = fsdpctl.prepare(str(profile), job=str(job), runs_dir=tmp_path / "runs")
    assert prepared.loaded.profile.notify == NotifySpec(command=("/bin/true",), events=("failed",))
    (tmp_path / "inputs.json").write_text(json.dumps(prepared.inputs))
    run = SimpleNamespace(root=tmp_path, profile=parse_profile(profile.read_text(), "lab.yaml"))
    assert notify_spec_of(run) == prepared.loaded.profile.notify
    (tmp_path / "inputs.json").write_text("{}")
    assert notify_spec_of(run) == NotifySpec(urls=("json://a/b",))
