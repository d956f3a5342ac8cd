"""Fuzz the profile loader: whatever the document, it is a profile or one ProfileError line.

Three generators: valid profiles with one field broken, arbitrary YAML values, and raw text.
A counter proves at least 1000 *rejected* documents were tried, so the fuzzing cannot pass by
generating only valid input.
"""

from __future__ import annotations

import copy

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdpctl.errors import ProfileError
from fsdpctl.profiles.loader import parse_profile
from fsdpctl.profiles.schema import ClusterProfile

BASE = {
    "name": "lab",
    "backend": "ssh",
    "hosts": ["n1", {"host": "n2", "address": "10.1.0.2", "port": 22, "gpus": 8}],
    "nproc_per_node": "auto",
    "device": "cuda",
    "network": {"interface": "eth0", "ib": False},
    "rendezvous": {"backend": "c10d", "port": 29500, "host": "n1"},
    "python": "/opt/venv/bin/python",
    "setup": ["source /opt/venv/bin/activate"],
    "workdir": "~/fsdpctl",
    "env": {"NCCL_DEBUG": "WARN"},
    "ssh": {"user": "me", "port": 22, "host_key_policy": "reject", "connect_timeout": 5},
    "slurm": {"partition": "gpu", "time": "01:00:00", "nodes": 2, "directives": ["--exclusive"]},
    "train": {"preset": "small", "steps": 10, "fsdp": 2, "mixed_precision": "bf16"},
}

rejected = {"count": 0}

nasty_text = st.sampled_from(["", " ", "a;rm -rf /", "$(reboot)", "`id`", "x\ny", "\x00", "é", "'\"", "-1",
                              "yes", "no", "null", "~", "0x1F", "1e999", "1:30:00", "[", "{a: 1}", "*a"])
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True), nasty_text, st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def paths(doc, prefix=()):
    """Every (path) inside a nested dict/list, so a mutation can target any of them."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from paths(value, (*prefix, index))


ALL_PATHS = [p for p in paths(BASE) if p]


def check(text: str) -> None:
    try:
        result = parse_profile(text, "lab.yaml")
    except ProfileError as exc:
        message = str(exc)
        assert message.startswith("lab.yaml"), message
        assert "\n" not in message, message
        rejected["count"] += 1
        return
    assert isinstance(result, ClusterProfile)


@settings(max_examples=900, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(ALL_PATHS), value=values, mode=st.sampled_from(["replace", "delete", "add"]))
def test_one_broken_field(path, value, mode):
    doc = copy.deepcopy(BASE)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if mode == "replace":
        parent[last] = value
    elif mode == "delete":
        del parent[last]
    elif isinstance(parent, dict):
        parent[f"{last}_extra" if isinstance(last, str) else "extra"] = value
    else:
        parent.append(value)
    check(yaml.safe_dump(doc, allow_unicode=True))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=values)
def test_arbitrary_yaml_value(doc):
    check(yaml.safe_dump(doc, allow_unicode=True))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(max_size=200))
def test_arbitrary_text(text):
    check(text)


def test_fuzzing_rejected_at_least_1000_documents():
    # Runs after the three generators above (pytest keeps definition order within a module).
    assert rejected["count"] >= 1000, rejected
