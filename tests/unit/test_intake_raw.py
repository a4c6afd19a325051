"""codec.intake on messages as the consumer really gets them (confluent_kafka.Message holding librdkafka's
header list): the native intake reads a plain stored message straight from that list and fills its row's
slots itself; whatever it does, the batch is the one `decide` gives message by message."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronos import codec
from chronos.codec import implementation, librdkafka
from chronos.domain.model import Row
from chronos.roles.consumer import sorting as consumer
from chronos.roles.consumer import Batch, sort_batch
from rdkafka_raw import message_with_headers
from test_intake_native import BOUNDED, IMPLS, NOW, RULES, one_by_one

pytestmark = pytest.mark.skipif(librdkafka.BINDING is None, reason="needs librdkafka's header functions")


def ms(us: int) -> bytes:
    return str(us // 1000).encode()


ids = st.sampled_from([b"a", b"b", b"c", b"", b"\xc3\xa9t\xc3\xa9", b"a\x00b", b"\xff", b"x" * 129, b"y" * 128])
deadlines = st.sampled_from([ms(NOW + 10_000_000), ms(NOW + 50_001), ms(NOW + 50_000), ms(NOW - 500_000),
                             ms(NOW - 5_000_000), b"", b"soon", b"2027-01-01T00:00:00Z"])
others = st.lists(st.sampled_from([
    (b"traceparent", b"00-ab"), (b"traceparent", None), (b"content-type", b""), (b"chronosUnknown", b"x"),
    (b"\xc3\xa9", b"accent"), (b"\xff\xfe", b"bad name"), (b"a\x00b", b"nul"),
    (b"chronosTopic", b"out"), (b"chronosTopic", b"billing.eu"), (b"chronosTopic", b"nope!"), (b"chronosTopic", None),
    (b"chronosAction", b"cancel"), (b"chronosAction", b"replace"), (b"chronosOrderingKey", b"k"),
    (b"chronosCron", b"0 9 * * *"), (b"chronosMessageId", b"a"), (b"chronosDeadline", ms(NOW + 1_000_000)),
    (b"chronosMessageId", None), (b"chronosDeadline", None), (b"chronosDstPolicy", b"skip"),
]), max_size=4)


@st.composite
def raw_messages(draw):
    headers = draw(others)
    headers.insert(draw(st.integers(0, len(headers))), (b"chronosMessageId", draw(ids)))
    headers.insert(draw(st.integers(0, len(headers))), (b"chronosDeadline", draw(deadlines)))
    return message_with_headers(headers, partition=draw(st.integers(0, 7)))


@IMPLS
@settings(max_examples=400, deadline=None)
@given(batch=st.lists(raw_messages(), max_size=10), rules=st.sampled_from([RULES, BOUNDED]))
def test_a_poll_is_sorted_as_decide_sorts_each_message(impl, batch, rules):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(consumer.codec, "intake", implementation(impl).intake)
        assert sort_batch(batch, NOW, rules) == one_by_one(batch, NOW, rules)


def plain(i: int, *extra, partition: int | None = None) -> object:
    return message_with_headers([(b"chronosMessageId", b"m%d" % i), (b"traceparent", b"00-ab"),
                                 (b"chronosDeadline", ms(NOW + 60_000_000)), *extra], partition=partition)


def test_plain_stored_messages_are_read_without_a_header_list(monkeypatch):
    """The lever: no header list, no Parsed per stored message (read_headers and parse_headers would
    build both)."""
    native = implementation("native")
    monkeypatch.setattr(native, "read_headers", lambda msg: pytest.fail("a header list was built"))
    monkeypatch.setattr(native, "parse_headers", lambda headers: pytest.fail("a Parsed was built"))
    messages = [plain(0), plain(1, (b"content-type", None), partition=6), plain(2, (b"chronosTopic", b"out"))]
    batch = Batch()
    assert native.intake(messages, 0, NOW, 50_000, None, "out", batch, Row, consumer.INSERT) == (3, None)
    assert batch.ops["m1"][1] == Row("m1", NOW + 60_000_000, None, b"k", b"v",
                                     codec.encode_headers([("traceparent", b"00-ab"), ("content-type", None)]),
                                     input_partition=6)
    assert batch.sources == {"m0": messages[0], "m1": messages[1], "m2": messages[2]}


def test_the_row_is_built_without_its_python_init(monkeypatch):
    """The lever: intake fills the slots of a slotted dataclass row itself (no Python frame per row); the
    row equals one built by its __init__."""
    native = implementation("native")
    calls = []

    # a row class like Row (its fields, slotted), its generated __init__ watched
    Counted = dataclasses.make_dataclass("Counted", [(f.name, f.type, dataclasses.field(default=f.default))
                                                     for f in dataclasses.fields(Row)], slots=True)
    generated = Counted.__init__

    def watched(self, *args, **kwargs):
        calls.append(args)
        generated(self, *args, **kwargs)

    Counted.__init__ = watched
    batch = Batch()
    native.intake([plain(0, partition=4)], 0, NOW, 50_000, None, "out", batch, Counted, consumer.INSERT)
    assert calls == []
    row = batch.ops["m0"][1]
    assert type(row) is Counted
    assert (row.id, row.deadline_us, row.topic, row.key, row.value, row.ordering_key, row.input_partition, row.cron,
            row.dst_policy) == ("m0", NOW + 60_000_000, None, b"k", b"v", None, 4, None, None)
    assert codec.decode_headers(row.headers) == [("traceparent", b"00-ab")]


@pytest.mark.parametrize("make_row", [
    lambda *fields: ("row", *fields),                       # not a class: called
    type("Plain", (), {"__init__": lambda self, *a: setattr(self, "fields", a)}),  # not a dataclass: called
])
def test_any_other_row_maker_is_called(make_row):
    batch = Batch()
    implementation("native").intake([plain(0)], 0, NOW, 50_000, None, "out", batch, make_row, consumer.INSERT)
    row = batch.ops["m0"][1]
    fields = row[1:] if isinstance(row, tuple) else row.fields
    assert fields[:5] == ("m0", NOW + 60_000_000, None, b"k", b"v") and fields[6] is None and fields[7] is None

