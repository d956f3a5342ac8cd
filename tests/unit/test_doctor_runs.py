"""How the compute and link checks' verdicts land on each host's checks."""

from __future__ import annotations

from fsdpctl.api.doctor_runs import add_compute_checks, add_link_checks
from fsdpctl.hostcheck.checks import DoctorReport, HostReport

HOSTS = ["n1", "n2", "n3", "n4"]


def report() -> DoctorReport:
    return DoctorReport(profile="p", hosts=[HostReport(host=h, node_rank=i) for i, h in enumerate(HOSTS)],
                        parity=[], seconds=0.1)


def verdicts(found: DoctorReport, name: str) -> dict[str, tuple[str, str]]:
    return {h.host: (c.status, c.detail) for h in found.hosts for c in h.checks if c.name == name}


def links(slow: str | None) -> dict:
    nodes = [{"node": i, "host": h, "rank": i, "node_rank": i} for i, h in enumerate(HOSTS)]
    pairs = [{"a": a, "b": b, "round": 0, "seconds": 0.1,
              "gbps": 0.01 if slow in (HOSTS[a], HOSTS[b]) else 0.9 + 0.01 * (a + b)}
             for a in range(4) for b in range(a + 1, 4)]
    return {"backend": "gloo", "nodes": nodes, "pairs": pairs, "rounds": 3}


def test_the_slow_link_fails_its_host_alone():
    found = report()
    add_link_checks(found, links("n3"))
    shown = verdicts(found, "links")
    assert shown["n3"][0] == "fail" and shown["n3"][1].startswith("the slow link: 3 of its 3 pairs are slow")
    assert {h: s for h, (s, _) in shown.items() if h != "n3"} == {"n1": "pass", "n2": "pass", "n4": "pass"}
    even = report()
    add_link_checks(even, links(None))
    assert {s for s, _ in verdicts(even, "links").values()} == {"pass"}


def test_a_slow_rank_fails_its_host_and_names_its_local_rank():
    ranks = [{"rank": r, "local_rank": r % 2, "node": r // 2, "host": HOSTS[r // 2], "device_name": "H100",
              "tflops": 300.0 if r == 5 else 700.0 + r} for r in range(8)]
    found = report()
    add_compute_checks(found, {"device": "cuda", "ranks": ranks})
    shown = verdicts(found, "compute")
    assert shown["n3"][0] == "fail" and shown["n3"][1].startswith("local rank 1 at 0.43x the median")
    assert [s for h, (s, _) in shown.items() if h != "n3"] == ["pass", "pass", "pass"]
