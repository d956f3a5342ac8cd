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
from fsdpctl.profiles.notify_spec import NEEDS_A_PERSON, NotifySpec
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
                        on_given_up=lambda target, text: notes.append((target, text)), backoff=(0.2, 0.2, 0.2))
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
