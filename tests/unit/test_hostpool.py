"""Spare hosts: choosing a run's hosts around the excluded ones, remembering exclusions per profile,
which node a failed attempt is blamed on, and which hosts a check found unfit (all pure, or one file)."""

from __future__ import annotations

import signal

import pytest

import fsdpctl
from fsdpctl.api.hosts import hosts
from fsdpctl.errors import ProfileError, UsageError
from fsdpctl.hostcheck.checks import Check, DoctorReport, HostReport, ParityEntry
from fsdpctl.hostpool.blame import nodes_to_blame, unfit_hosts
from fsdpctl.hostpool.choice import choose_hosts
from fsdpctl.hostpool.placing import place_hosts
from fsdpctl.hostpool.store import Exclusion, add_exclusions, exclusions_file, read_exclusions, remove_exclusion
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.rundir.state import NodeState
from fsdpctl.rundir.status import NodeStatus

PROFILE = ("name: sp\nbackend: ssh\nhosts: [n1, n2]\nspares: [n3, {host: n4, interface: eth1}]\n"
           "nproc_per_node: 1\ndevice: cpu\n")


def profile(text: str = PROFILE):
    return parse_profile(text, "sp.yaml")


def test_without_exclusions_the_hosts_are_the_profiles():
    choice = choose_hosts(profile(), {})
    assert choice.hosts == ("n1", "n2") and not choice.replacements and not choice.missing
    assert [h.host for h in choice.profile.spares] == ["n3", "n4"]


def test_an_excluded_host_gets_the_first_spare_in_its_own_place():
    choice = choose_hosts(profile(), {"n1": "lost"})
    assert choice.hosts == ("n3", "n2")  # node ranks keep the host order: the spare is node 0 now
    assert [r.describe() for r in choice.replacements] == ["n3 in the place of n1 (lost)"]
    assert [h.host for h in choice.profile.spares] == ["n4"]


def test_an_excluded_spare_is_never_chosen_and_its_own_settings_come_along():
    choice = choose_hosts(profile(), {"n2": "lost", "n3": "failed the preflight"})
    assert choice.hosts == ("n1", "n4") and choice.profile.hosts[1].interface == "eth1"
    assert not choice.profile.spares


def test_the_rendezvous_moves_to_the_first_node_when_its_host_is_excluded():
    prof = profile(PROFILE + "rendezvous:\n  host: n2\n")
    assert choose_hosts(prof, {}).profile.rendezvous.host == "n2"
    assert choose_hosts(prof, {"n2": "lost"}).profile.rendezvous.host is None


def test_with_no_spare_left_the_choice_says_how_many_hosts_are_missing():
    excluded = {"n1": "lost", "n2": "failed the re-check", "n3": "x", "n4": "y"}
    choice = choose_hosts(profile(), excluded)
    assert choice.missing == ("n1", "n2")
    assert choice.shortage(excluded) == ("2 of its 2 hosts excluded and no spare left (n1: lost; n2: failed the "
                                         "re-check): 2 host(s) missing")


def test_exclusions_are_remembered_per_profile_first_reason_kept_and_forgotten_on_restore(tmp_path):
    add_exclusions("sp", [Exclusion("n2", "lost", "sp-1", "t1")])
    add_exclusions("sp", [Exclusion("n2", "again", "sp-2", "t2"), Exclusion("n3", "bad torch", None, "t3")])
    assert read_exclusions("other") == {}
    found = read_exclusions("sp")
    assert found["n2"] == Exclusion("n2", "lost", "sp-1", "t1") and found["n3"].run_id is None
    assert exclusions_file("sp").parent.parent == tmp_path / "fsdpctl-state"
    assert remove_exclusion("sp", "n2").reason == "lost" and remove_exclusion("sp", "n2") is None
    assert list(read_exclusions("sp")) == ["n3"]


def node(rank: int, host: str, state: NodeState, *, signum: int | None = None, stopped: bool = False,
         detail: str | None = None) -> NodeStatus:
    return NodeStatus(node_rank=rank, host=host, state=state, signal=signum, stopped=stopped, detail=detail,
                      exit_code=1 if state is NodeState.FAILED else None)


def test_a_lost_node_is_to_blame():
    nodes = [node(0, "n1", NodeState.FAILED, stopped=True),
             node(1, "n2", NodeState.LOST, detail="nothing heard from it since 12:00:01")]
    assert nodes_to_blame(nodes) == {"n2": "lost: nothing heard from it since 12:00:01"}


def test_a_node_that_went_quiet_while_being_stopped_after_another_failed_is_not_blamed():
    nodes = [node(0, "n1", NodeState.LOST, stopped=True, detail="nothing heard from it since 14:59:34"),
             node(1, "n2", NodeState.LOST, detail="nothing heard from it since 14:59:29")]
    assert nodes_to_blame(nodes) == {"n2": "lost: nothing heard from it since 14:59:29"}


def test_ranks_killed_by_a_signal_on_one_node_alone_blame_it():
    nodes = [node(0, "n1", NodeState.FAILED, signum=signal.SIGTERM, stopped=True),
             node(1, "n2", NodeState.FAILED, signum=signal.SIGKILL)]
    assert nodes_to_blame(nodes) == {"n2": "its ranks died by SIGKILL, which no other node's got"}


@pytest.mark.parametrize("nodes", [
    # the program's own error: an exit code, on one node or every one
    [node(0, "n1", NodeState.FAILED, stopped=True), node(1, "n2", NodeState.FAILED)],
    [node(0, "n1", NodeState.FAILED), node(1, "n2", NodeState.FAILED)],
    # the same signal on every node: the program (a segfault everywhere), not one node
    [node(0, "n1", NodeState.FAILED, signum=signal.SIGSEGV), node(1, "n2", NodeState.FAILED, signum=signal.SIGSEGV)],
    # fsdpctl's own stop, or the user's Ctrl-C
    [node(0, "n1", NodeState.FAILED, signum=signal.SIGTERM), node(1, "n2", NodeState.SUCCEEDED)],
    [node(0, "n1", NodeState.FAILED, signum=signal.SIGINT), node(1, "n2", NodeState.FAILED, signum=signal.SIGINT)],
])
def test_a_programs_own_error_blames_no_node(nodes):
    assert nodes_to_blame(nodes) == {}


def report(*hosts: HostReport, parity: tuple[ParityEntry, ...] = ()) -> DoctorReport:
    return DoctorReport(profile="sp", hosts=list(hosts), parity=list(parity), seconds=0.1)


def test_unfit_hosts_are_those_a_check_failed_on_and_those_differing_from_the_trusted_ones():
    ok = [Check("reachable", "pass", "connected")]
    torch = ParityEntry("torch", "fail", {"n1": "2.13.0", "n3": "2.99.0+fake"}, "differs")
    found = report(HostReport("n1", 0, checks=ok), HostReport("n2", 1, checks=[
        Check("reachable", "fail", "timed out connecting")]), HostReport("n3", 2, checks=ok), parity=(torch,))
    assert unfit_hosts(found, trusted=["n1"]) == {"n2": "reachable: timed out connecting",
                                                  "n3": "torch 2.99.0+fake where the others have 2.13.0"}
    # trusting the other side turns the verdict round: the run's own hosts are the reference
    assert list(unfit_hosts(found, trusted=["n3"])) == ["n2", "n1"]


def test_a_host_that_only_cannot_reach_a_master_which_failed_itself_is_not_held_unfit():
    ok = [Check("reachable", "pass", "connected")]
    victim = [Check("reachable", "pass", "connected"), Check("port", "fail", "cannot reach the master at n1:25 (timed "
                                                                              "out)")]
    gone = report(HostReport("n1", 0, checks=[Check("reachable", "fail", "timed out connecting")]),
                  HostReport("n2", 1, checks=victim), HostReport("n3", 2, checks=ok))
    assert unfit_hosts(gone, trusted=["n1", "n2"]) == {"n1": "reachable: timed out connecting"}
    # the master answers and only n2 cannot reach it: n2's own link is the suspect
    alone = report(HostReport("n1", 0, checks=ok), HostReport("n2", 1, checks=victim))
    assert list(unfit_hosts(alone, trusted=["n1", "n2"])) == ["n2"]


def test_a_launch_uses_a_spare_in_the_place_of_a_remembered_exclusion_and_names_it():
    add_exclusions("sp", [Exclusion("n1", "lost: nothing heard", "sp-1", "2026-11-25T10:00:00")])
    choice = place_hosts(profile())
    assert choice.hosts == ("n3", "n2")
    assert choice.replacements[0].why == "lost: nothing heard (excluded 2026-11-25T10:00:00 by run sp-1)"
    assert place_hosts(profile(), exclude=("n3",)).hosts == ("n4", "n2")


def test_a_launch_without_enough_hosts_is_refused_saying_how_many_are_missing():
    add_exclusions("sp", [Exclusion(h, "lost", "sp-1", "t") for h in ("n1", "n3", "n4")])
    with pytest.raises(UsageError) as refused:
        place_hosts(profile(), exclude=("n2",))
    assert "2 host(s) missing" in refused.value.message and "--restore" in refused.value.hint
    with pytest.raises(UsageError, match="--exclude n9: not a host of profile sp"):
        place_hosts(profile(), exclude=("n9",))


def test_hosts_lists_active_spare_and_excluded_with_why_and_by_which_run(tmp_path):
    path = tmp_path / "sp.yaml"
    path.write_text(PROFILE)
    add_exclusions("sp", [Exclusion("n2", "lost: nothing heard", "sp-1", "2026-11-25T10:00:00")])
    found = hosts(path)
    assert [(h.host, h.role, h.node_rank, h.replaces) for h in found] == [
        ("n1", "active", 0, None), ("n3", "active", 1, "n2"), ("n4", "spare", None, None),
        ("n2", "excluded", None, None)]
    assert found[-1].describe() == "n2\texcluded\tlost: nothing heard (since 2026-11-25T10:00:00 by run sp-1)"
    assert fsdpctl.hosts is hosts
    with pytest.raises(UsageError, match="--restore n1: not excluded from profile sp"):
        hosts(path, restore="n1")


@pytest.mark.parametrize("text, field", [
    (PROFILE.replace("[n3, {host: n4, interface: eth1}]", "[n3, n3]"), "spares"),
    (PROFILE.replace("[n3, {host: n4, interface: eth1}]", "[n2]"), "spares"),
    ("name: l\nbackend: local\nspares: [n3]\n", "spares"),
])
def test_a_spare_listed_twice_or_on_a_backend_without_spares_is_refused_at_its_line(text, field):
    with pytest.raises(ProfileError) as refused:
        parse_profile(text, "sp.yaml")
    assert refused.value.field == field, refused.value.message


def test_a_host_excluded_by_hand_is_remembered_until_restored_and_never_leaves_a_run_short(tmp_path):
    path = tmp_path / "sp.yaml"
    path.write_text(PROFILE)
    found = hosts(path, exclude="n1", reason="fan noise")
    assert [(h.host, h.role) for h in found][:2] == [("n3", "active"), ("n2", "active")]
    assert read_exclusions("sp")["n1"].reason == "fan noise" and read_exclusions("sp")["n1"].run_id is None
    hosts(path, exclude="n3")
    with pytest.raises(UsageError, match="1 host\\(s\\) missing"):
        hosts(path, exclude="n4")
    with pytest.raises(UsageError, match="--exclude n9: not a host of profile sp"):
        hosts(path, exclude="n9")


def test_a_spare_added_to_the_profile_file_while_a_run_goes_counts_for_its_next_attempt(tmp_path):
    """The run holds a copy of its profile; its next attempt takes the spares the file names now,
    never one of the hosts the run started on, and keeps its own when the file no longer reads."""
    import json
    from types import SimpleNamespace

    from fsdpctl.api.attempts import profile_now

    source = tmp_path / "sp.yaml"
    source.write_text(PROFILE)
    (tmp_path / "inputs.json").write_text(json.dumps({"profile_source": str(source)}))
    run = SimpleNamespace(root=tmp_path, profile=profile(), run_id="sp-1")
    said = []
    emit = SimpleNamespace(notice=lambda text, level="info": said.append((level, text)))
    assert profile_now(run, emit) is run.profile and not said  # nothing changed: the copy itself

    source.write_text(PROFILE.replace("spares: [n3,", "spares: [n5, n3,"))
    now = profile_now(run, emit)
    assert [s.host for s in now.spares] == ["n5", "n3", "n4"] and now.hosts == run.profile.hosts
    assert said == [("info", f"profile sp: spares now n5, n3, n4 (n5 added; read from {source})")]
    assert choose_hosts(now, {"n1": "lost"}).hosts == ("n5", "n2")
    # the file's hosts changed too: they are not the run's, and a host the run is on is never its spare
    source.write_text(PROFILE.replace("hosts: [n1, n2]", "hosts: [n6, n2]").replace("spares: [n3,", "spares: [n1, n3,"))
    assert [s.host for s in profile_now(run, emit).spares] == ["n3", "n4"] and len(said) == 1

    source.write_text(PROFILE.replace("spares: [n3, {host: n4, interface: eth1}]", "spares: []"))
    assert [s.host for s in profile_now(run, emit).spares] == []
    assert said[-1] == ("info", f"profile sp: spares now none (n3 taken out, n4 taken out; read from {source})")

    source.write_text(PROFILE.replace("hosts: [n1, n2]", "hosts: n1"))
    assert profile_now(run, emit) is run.profile
    level, text = said[-1]
    assert level == "warning" and text.startswith(f"{source} no longer reads (") and "sp-1 keeps the spares" in text
    source.write_text(PROFILE.replace("name: sp", "name: other"))  # now another profile's file: not this run's
    assert profile_now(run, emit) is run.profile
    source.unlink()
    count = len(said)
    assert profile_now(run, emit) is run.profile and len(said) == count
