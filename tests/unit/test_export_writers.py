"""The export writers read back by the tools they write for: TensorBoard's own event file reader (its stub
without TensorFlow, which checks every CRC) and prometheus_client's text parser; each event byte for byte
what TensorBoard's own protobuf classes serialize."""

from __future__ import annotations

import itertools
import math
import os
import re
import socket
import stat
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import parser as prometheus_parser
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat import tf as tf_or_stub
from tensorboard.compat.proto import event_pb2, summary_pb2

from fsdpctl.export import prometheus as prom
from fsdpctl.export import tensorboard as tb
from fsdpctl.export.prometheus import Family, render, write_textfile
from fsdpctl.export.tensorboard import EventWriter, crc32c, masked_crc32c

HOSTILE_TAGS = [
    "loss/train",
    "gpu/node0/gpu3/sm_clock_mhz",
    "损失/训练 🚀",
    'quote" and \'single\' and \\backslash',
    "new\nline\ttab\x00nul",
    "<script>alert(1)</script>",
    "x" * 20_000,  # its lengths take 3-byte varints at every level
]


def raw_events(path) -> list[event_pb2.Event]:
    """Every Event in ``path`` as TensorBoard's raw loader yields them (it stops at the first bad CRC)."""
    return [event_pb2.Event.FromString(raw) for raw in event_file_loader.RawEventFileLoader(str(path)).Load()]


def as_float32(value: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:  # past float32's range: IEEE rounds it to an infinity
        return math.copysign(math.inf, value)


def test_tensorboard_reads_without_tensorflow_through_its_stub():
    # Without TensorFlow, tensorboard.compat.tf is tensorboard.compat.tensorflow_stub, whose PyRecordReader_New
    # (compat/tensorflow_stub/pywrap_tensorflow.py) reads the records and checks both CRCs of each.
    assert tf_or_stub.__version__ == "stub"


def test_crc32c_matches_the_published_vectors_and_tensorboards_own():
    assert crc32c(b"") == 0
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 (iSCSI) B.4
    assert crc32c(b"\xff" * 32) == 0x62A8AB43
    assert crc32c(bytes(range(32))) == 0x46DD794E
    stub_crc = tf_or_stub.pywrap_tensorflow.masked_crc32c
    for data in (b"", b"a", os.urandom(7), os.urandom(1000)):
        assert masked_crc32c(data) == stub_crc(data)


def test_scalars_read_back_with_their_tags_steps_wall_times_and_float32_values(tmp_path):
    items = [("loss/train", 2.5, 0, 1_700_000_000.123456), ("loss/train", 0.1, 1, 1_700_000_001.5),
             ("lr", 3e-4, 1, 1_700_000_001.5), ("lr", -0.0, 2**62, 1_700_000_002.0),
             ("loss/train", 1e40, -3, 1_700_000_003.0), ("loss/train", 1e-50, 4, 1_700_000_004.0)]
    with EventWriter(tmp_path / "tb") as writer:
        writer.scalars(items)
    events = raw_events(writer.path)
    assert events[0].file_version == "brain.Event:2" and not events[0].HasField("summary")
    scalars = events[1:]
    assert len(scalars) == len(items)
    for event, (tag, value, step, wall_time) in zip(scalars, items, strict=True):
        assert event.wall_time == wall_time  # a double: exact
        assert event.step == step
        (summary_value,) = event.summary.value
        assert summary_value.tag == tag
        assert summary_value.WhichOneof("value") == "simple_value"  # set even when it is 0: oneof presence
        assert summary_value.simple_value == as_float32(value)
    assert math.copysign(1, scalars[3].summary.value[0].simple_value) == -1  # -0.0 keeps its sign
    assert scalars[4].summary.value[0].simple_value == math.inf  # past float32's range, as TensorFlow rounds it
    # The loader TensorBoard serves from migrates simple_value to a scalar tensor: the values survive that too
    loaded = list(event_file_loader.EventFileLoader(str(writer.path)).Load())
    assert [e.summary.value[0].tensor.float_val[0] for e in loaded[1:]] == [as_float32(v) for _, v, _, _ in items]


def test_scalars_at_one_step_are_one_event_that_tensorboard_reads_as_each_tags_scalar(tmp_path):
    gpus = [(f"gpu/node3/gpu{g}/{name}", value) for g in range(8) for name, value in (("sm_clock_mhz", 1980 - g),
                                                                                        ("temp_c", 60.5))]
    with EventWriter(tmp_path / "tb") as writer:
        writer.scalars_at(7, gpus, 1_700_000_000.25)
        writer.scalars_at(8, [("gpu/node3/gpu0/sm_clock_mhz", 1095)], 1_700_000_005.25)
        writer.scalars_at(9, [])  # nothing to write: no event
        with pytest.raises(ValueError, match="cannot be empty"):
            writer.scalars_at(9, [("ok", 1.0), ("", 2.0)])
    events = raw_events(writer.path)
    assert len(events) == 3  # the version's, then one per call
    assert events[1].step == 7 and events[1].wall_time == 1_700_000_000.25
    assert [(v.tag, v.simple_value) for v in events[1].summary.value] == [(tag, as_float32(v)) for tag, v in gpus]
    # byte for byte what TensorBoard's own classes make of the same event
    own = event_pb2.Event(wall_time=1_700_000_000.25, step=7, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in gpus]))
    assert events[1].SerializeToString() == own.SerializeToString()
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    assert len(accumulator.Tags()["scalars"]) == 16
    assert [(e.step, e.value) for e in accumulator.Scalars("gpu/node3/gpu0/sm_clock_mhz")] == [(7, 1980), (8, 1095)]
    assert [(e.step, e.value) for e in accumulator.Scalars("gpu/node3/gpu7/temp_c")] == [(7, 60.5)]


def test_non_finite_values_are_written_as_they_are_and_tensorboard_serves_them(tmp_path):
    with EventWriter(tmp_path) as writer:
        for step, value in enumerate([math.nan, math.inf, -math.inf, 1.0]):
            writer.scalar("loss/train", value, step, wall_time=1000.0 + step)
    accumulator = EventAccumulator(str(tmp_path))  # the folder, as TensorBoard's scalars plugin reads it
    accumulator.Reload()
    assert accumulator.Tags()["scalars"] == ["loss/train"]
    points = accumulator.Scalars("loss/train")
    assert [p.step for p in points] == [0, 1, 2, 3]
    assert [p.wall_time for p in points] == [1000.0, 1001.0, 1002.0, 1003.0]
    assert math.isnan(points[0].value) and points[1].value == math.inf and points[2].value == -math.inf
    assert points[3].value == 1.0


def test_a_file_written_in_two_flushes_reads_whole_and_a_tailing_reader_sees_each_flush(tmp_path):
    writer = EventWriter(tmp_path, suffix=".fsdpctl")
    loader = event_file_loader.RawEventFileLoader(str(writer.path))  # one reader polling, as TensorBoard does
    assert len(list(loader.Load())) == 1  # the version record is out as soon as the writer exists
    for step in range(100):
        writer.scalar("loss/train", step / 10, step)
    assert list(loader.Load()) == []  # buffered until flushed
    writer.flush()
    assert len(list(loader.Load())) == 100
    for step in range(100, 150):
        writer.scalar("loss/train", step / 10, step)
    writer.close()
    writer.close()  # twice is harmless
    assert len(list(loader.Load())) == 50
    events = raw_events(writer.path)
    assert [e.step for e in events[1:]] == list(range(150))
    with pytest.raises(ValueError, match="closed"):
        writer.scalar("loss/train", 1.0, 150)


@pytest.mark.parametrize("where", ["data", "length", "data crc"])
def test_the_reader_stops_at_a_corrupted_record(tmp_path, where):
    with EventWriter(tmp_path) as writer:
        for step in range(3):
            writer.scalar("loss/train", 1.0, step)
    data = bytearray(writer.path.read_bytes())
    offsets = [0]  # where each record starts
    while offsets[-1] < len(data):
        (length,) = struct.unpack_from("<Q", data, offsets[-1])
        offsets.append(offsets[-1] + 8 + 4 + length + 4)
    second_scalar = offsets[2]
    (length,) = struct.unpack_from("<Q", data, second_scalar)
    flip = {"data": second_scalar + 12 + length // 2, "length": second_scalar, "data crc": offsets[3] - 1}[where]
    data[flip] ^= 0x01
    writer.path.write_bytes(bytes(data))
    assert [e.step for e in raw_events(writer.path)[1:]] == [0]  # the records before it, nothing from it on


def test_a_wrong_crc_from_the_writer_would_be_caught(tmp_path, monkeypatch):
    real = tb.masked_crc32c
    monkeypatch.setattr(tb, "masked_crc32c", lambda data: real(data) ^ 1)
    monkeypatch.setattr(tb, "_header_crcs", {})  # the cache holds right ones
    with EventWriter(tmp_path) as writer:
        writer.scalar("loss/train", 1.0, 0)
    assert writer.path.stat().st_size > 0
    assert raw_events(writer.path) == []


@pytest.mark.parametrize("tag", HOSTILE_TAGS, ids=range(len(HOSTILE_TAGS)))
def test_hostile_tags_round_trip(tmp_path, tag):
    with EventWriter(tmp_path) as writer:
        writer.scalar(tag, 1.25, 7, wall_time=5.0)
        writer.scalar(tag, 2.5, 8, wall_time=6.0)
    events = raw_events(writer.path)[1:]
    assert [(e.summary.value[0].tag, e.step, e.summary.value[0].simple_value) for e in events] == [
        (tag, 7, 1.25), (tag, 8, 2.5)]


@settings(max_examples=60, deadline=None)
@given(tag=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=300),
       value=st.floats(width=32), step=st.integers(-(2**63), 2**63 - 1),
       wall_time=st.floats(allow_nan=False))
def test_any_tag_value_step_and_wall_time_round_trip(tag, value, step, wall_time):
    written = tb.scalar_event(tag, value, step, wall_time)
    event = event_pb2.Event.FromString(written)
    assert (event.summary.value[0].tag, event.step, event.wall_time) == (tag, step, wall_time)
    read = event.summary.value[0].simple_value
    assert read == value or (math.isnan(read) and math.isnan(value))
    # byte for byte what TensorBoard's own classes serialize (proto3: a zero step or wall time left out)
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    assert written == event_pb2.Event(wall_time=wall_time, step=step, summary=summary).SerializeToString()


@pytest.mark.parametrize("tag, step, error", [
    ("", 0, ValueError), ("\ud800lone surrogate", 0, ValueError), (b"bytes", 0, TypeError),
    ("ok", 2**63, ValueError), ("ok", -(2**63) - 1, ValueError), ("ok", 1.5, TypeError),
])
def test_bad_tags_and_steps_are_refused(tmp_path, tag, step, error):
    with EventWriter(tmp_path) as writer, pytest.raises(error):
        writer.scalar(tag, 1.0, step)


def test_each_writer_gets_a_new_file_named_as_tensorboard_names_them(tmp_path, monkeypatch):
    class FixedClock:
        @staticmethod
        def time() -> float:
            return 1_700_000_000.9

    monkeypatch.setattr(tb, "time", FixedClock)
    monkeypatch.setattr(tb, "_file_counter", itertools.count(9))
    taken = tmp_path / f"events.out.tfevents.1700000000.{socket.gethostname()}.{os.getpid()}.000009"
    taken.write_bytes(b"someone else's")
    with EventWriter(tmp_path) as first, EventWriter(tmp_path, suffix=".v2") as second:
        first.scalar("a", 1.0, 0)
        second.scalar("a", 2.0, 0)
    assert taken.read_bytes() == b"someone else's"  # never rewritten: the writer took the next number
    assert first.path.name == f"events.out.tfevents.1700000000.{socket.gethostname()}.{os.getpid()}.000010"
    assert second.path.name == f"events.out.tfevents.1700000000.{socket.gethostname()}.{os.getpid()}.000011.v2"
    assert sorted([taken.name, first.path.name]) == [taken.name, first.path.name]  # TensorBoard's reading order
    assert [raw_events(w.path)[1].summary.value[0].simple_value for w in (first, second)] == [1.0, 2.0]
    with pytest.raises(ValueError, match="suffix"):
        EventWriter(tmp_path, suffix="/../escape")


def test_the_folder_is_made_0700_when_the_writer_makes_it_and_left_alone_otherwise(tmp_path):
    os.chmod(tmp_path, 0o755)
    EventWriter(tmp_path / "runs" / "r1" / "tensorboard").close()
    for made in ("runs", "runs/r1", "runs/r1/tensorboard"):
        assert stat.S_IMODE((tmp_path / made).stat().st_mode) == 0o700, made
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755


# --- Prometheus ---------------------------------------------------------------------------------------------

HOSTILE_VALUES = ['say "hi"', "back\\slash", "trailing\\", "new\nline", "\\n literally", "<script>alert(1)</script>",
                  "comma, } = {", "ünïcødé 🚀", "", "   spaces   ", "tab\tcr\r", "\\\"\n\\"]


def parse(text: str) -> dict:
    return {f.name: f for f in prometheus_parser.text_string_to_metric_families(text)}


def test_gauges_and_counters_parse_back_with_their_help_types_labels_and_values():
    families = [
        Family("fsdpctl_gpu_sm_clock_mhz", "SM clock of each GPU, in MHz.", "gauge",
               [({"node": "0", "gpu": "3"}, 1980), ({"node": "1", "gpu": "0"}, 1095.5)]),
        Family("fsdpctl_steps_total", "Training steps done.", "counter", [({}, 1234)]),
        Family("fsdpctl_restarts", "Restarts of the run.", "counter", [({"run": "r1"}, 2)]),
        Family("fsdpctl_idle", "A family with no samples yet.", "gauge"),
    ]
    text = render(families)
    assert text.endswith("\n") and text.count("# HELP") == 4 and text.count("# TYPE") == 4
    parsed = list(prometheus_parser.text_string_to_metric_families(text))
    # prometheus_client names a counter family without _total and its samples with it
    assert [f.name for f in parsed] == ["fsdpctl_gpu_sm_clock_mhz", "fsdpctl_steps", "fsdpctl_restarts",
                                        "fsdpctl_idle"]
    assert [f.type for f in parsed] == ["gauge", "counter", "counter", "gauge"]
    assert parsed[0].documentation == "SM clock of each GPU, in MHz."
    assert [(s.name, s.labels, s.value) for s in parsed[0].samples] == [
        ("fsdpctl_gpu_sm_clock_mhz", {"node": "0", "gpu": "3"}, 1980.0),
        ("fsdpctl_gpu_sm_clock_mhz", {"node": "1", "gpu": "0"}, 1095.5)]
    assert [(s.name, s.labels, s.value) for s in parsed[1].samples] == [("fsdpctl_steps_total", {}, 1234.0)]
    assert [(s.name, s.labels, s.value) for s in parsed[2].samples] == [("fsdpctl_restarts_total", {"run": "r1"}, 2)]
    assert parsed[3].samples == []
    assert render([]) == ""


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=range(len(HOSTILE_VALUES)))
def test_hostile_label_values_and_help_round_trip(value):
    text = render([Family("m", f"help with {value}", "gauge", [({"a": value, "b": "after"}, 1.0)])])
    assert text.count("\n") == 3  # a newline in a value never starts a line of its own
    (family,) = parse(text).values()
    (sample,) = family.samples
    assert sample.labels == {"a": value, "b": "after"}
    # prometheus_client strips each whole line, so HELP loses trailing blanks; the escaping itself round-trips
    assert family.documentation == f"help with {value}".rstrip()


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,20}", fullmatch=True),
                       st.text(st.characters(exclude_categories=["Cs"])), max_size=5),
       st.floats())
def test_any_label_values_and_value_parse_back(labels, value):
    (family,) = parse(render([Family("fsdpctl_x", "x", "gauge", [(labels, value)])])).values()
    (sample,) = family.samples
    assert sample.labels == labels
    assert sample.value == value or (math.isnan(sample.value) and math.isnan(value))


def test_nan_and_infinities_are_written_as_prometheus_spells_them():
    text = render([Family("m", "h", "gauge", [({"v": "nan"}, math.nan), ({"v": "inf"}, math.inf),
                                               ({"v": "-inf"}, -math.inf), ({"v": "big"}, 2**70)])])
    assert re.findall(r" (\S+)$", text, re.MULTILINE)[-4:] == ["NaN", "+Inf", "-Inf", "1.1805916207174113e+21"]
    values = [s.value for s in parse(text)["m"].samples]
    assert math.isnan(values[0]) and values[1:] == [math.inf, -math.inf, 2.0**70]


def client_text(families: list[Family]) -> str:
    """What prometheus_client's own ``generate_latest`` writes of a registry holding ``families``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Source:
        def collect(self):
            for family in families:
                names = list(family.samples[0][0]) if family.samples else []
                make = GaugeMetricFamily if family.type == "gauge" else CounterMetricFamily
                metric = make(family.name, family.help, labels=names)
                for labels, value in family.samples:
                    metric.add_metric([labels[name] for name in names], value)
                yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Source())
    return generate_latest(registry).decode("utf-8")


label_values = st.text(st.characters(exclude_categories=["Cs"])) | st.sampled_from(HOSTILE_VALUES)
label_sets = st.lists(st.dictionaries(st.sampled_from(["gpu", "node", "host", "a", "Hostname", "pci_bus_id"]),
                                      label_values, min_size=0, max_size=4), max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True),
                          st.sampled_from(["gauge", "counter"]), st.text(), label_sets,
                          st.lists(st.floats(), min_size=4, max_size=4)),
                unique_by=lambda f: f[0].removesuffix("_total"), max_size=4))
def test_the_text_is_prometheus_clients_own_byte_for_byte(drawn):
    families = []
    for name, kind, words, labels, values in drawn:
        names = set(labels[0]) if labels else set()
        kept, shown = [], set()
        for one in labels:  # one set of label names per family, each label set once
            key = tuple(sorted(one.items()))
            if set(one) == names and key not in shown:
                shown.add(key)
                kept.append(one)
        families.append(Family(name, words, kind, list(zip(kept, values, strict=False))))
    assert render(families) == client_text(families)


def test_families_sharing_one_label_dict_as_a_gpus_do_render_as_prometheus_client_does():
    gpus = [{"run": "r", "gpu": str(g), "node": "0", "host": 'h"1', "Hostname": "h\\1", "pci_bus_id": "00:1"}
            for g in range(3)]
    families = [Family(name, "h", "gauge", [(labels, 1980.0 + g) for g, labels in enumerate(gpus)])
                for name in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP")]
    families.append(Family("fsdpctl_restarts_total", "r", "counter", [(gpus[0], 2)]))
    assert render(families) == client_text(families)
    with pytest.raises(ValueError, match="one set of label names per family"):
        render([Family("m", "h", "gauge", [({"a": "1"}, 1)]),
                Family("n", "h", "gauge", [({"b": "1"}, 1), (gpus[0], 2)])])


@pytest.mark.parametrize("family, bad", [
    (Family("1starts_with_digit", "h", "gauge"), "'1starts_with_digit'"),
    (Family("has-dash", "h", "gauge"), "'has-dash'"),
    (Family("trailing_newline\n", "h", "gauge"), "'trailing_newline\\n'"),
    (Family("ünicode", "h", "gauge"), "'ünicode'"),
    (Family("", "h", "gauge"), "''"),
    (Family("m", "h", "gauge", [({"0bad": "v"}, 1)]), "'0bad'"),
    (Family("m", "h", "gauge", [({"bad-label": "v"}, 1)]), "'bad-label'"),
    (Family("m", "h", "gauge", [({"__reserved": "v"}, 1)]), "'__reserved'"),
    (Family("m", "h", "gauge", [({"ok": "\ud800"}, 1)]), "'ok'"),
    (Family("m", "h", "histogram"), "'histogram'"),  # type: ignore[arg-type]
    (Family("m", "h", "gauge", [({"a": "1", "b": "2"}, 1), ({"b": "2", "a": "1"}, 2)]), "appears twice"),
    (Family("m", "h", "gauge", [({"a": "1"}, 1), ({"b": "1"}, 2)]), "one set of label names per family"),
])
def test_bad_names_and_series_are_refused_by_name(family, bad):
    with pytest.raises(ValueError) as caught:
        render([Family("fine", "h", "gauge"), family])
    assert bad in str(caught.value)


def test_a_family_twice_and_a_label_value_not_a_string_are_refused():
    with pytest.raises(ValueError, match="'m' appears twice"):
        render([Family("m", "h", "gauge"), Family("m", "h", "gauge")])
    with pytest.raises(TypeError, match="'gpu'"):
        render([Family("m", "h", "gauge", [({"gpu": 3}, 1.0)])])  # type: ignore[dict-item]


def test_write_textfile_replaces_atomically_with_mode_0644_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "fsdpctl.prom"
    old_umask = os.umask(0o077)  # a strict umask would leave node_exporter unable to read the file
    try:
        write_textfile(target, render([Family("m", "h", "gauge", [({}, 1.0)])]))
        first_inode = target.stat().st_ino
        write_textfile(target, render([Family("m", "h", "gauge", [({}, 2.0)])]))
    finally:
        os.umask(old_umask)
    assert os.listdir(tmp_path) == ["fsdpctl.prom"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert target.stat().st_ino != first_inode  # a new file renamed over the old one, never rewritten in place
    assert parse(target.read_text(encoding="utf-8"))["m"].samples[0].value == 2.0


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "fsdpctl.prom"
    write_textfile(target, "m 1\n")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(prom.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        write_textfile(target, "m 2\n")
    assert os.listdir(tmp_path) == ["fsdpctl.prom"]
    assert target.read_text() == "m 1\n"


def test_write_textfile_needs_the_folder_to_exist(tmp_path):
    missing = tmp_path / "textfile_collector"
    with pytest.raises(FileNotFoundError) as caught:
        write_textfile(missing / "fsdpctl.prom", "m 1\n")
    assert isinstance(caught.value, OSError)
    assert str(missing) in str(caught.value) and "--collector.textfile.directory" in str(caught.value)
    assert not missing.exists()
