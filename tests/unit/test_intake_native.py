"""codec.intake, the consumer's sorting of plain messages in native code (and its pure-Python twin):
the same batch as sorting every message by `decide`, whatever the mix of messages."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chronos import codec
from chronos.codec import implementation
from chronos.domain.intake import Rules
from chronos.roles.consumer import sorting as consumer
from chronos.roles.consumer.sorting import Batch, _sort_one, sort_batch
from kafka_double import FakeMessage

NOW = 1_800_000_000_000_000
RULES = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile("out|billing\\..*"))
BOUNDED = Rules(50_000, "out", re.compile("out"), max_lateness_us=1_000_000)
IMPLS = pytest.mark.parametrize("impl", ["native", "python"])


def one_by_one(messages, now_us: int, rules: Rules) -> Batch:
    """The reference: every message sorted by `decide`, one at a time."""
    batch = Batch()
    for msg in messages:
        _sort_one(batch, msg, now_us, rules)
    return batch


deadlines = st.sampled_from([NOW + 10_000_000, NOW + 50_001, NOW + 50_000, NOW - 500_000, NOW - 5_000_000])
extras = st.sampled_from([
    [], [], [],
    [("chronosAction", b"cancel")], [("chronosAction", b"replace")], [("chronosAction", b"bogus")],
    [("chronosTopic", b"out")], [("chronosTopic", b"billing.eu")], [("chronosTopic", b"payments")],
    [("chronosOrderingKey", b"k1")], [("chronosCron", b"0 9 * * *")], [("chronosTimeZone", b"UTC")],
    [("chronosDeadline", b"again")], [("traceparent", b"00-ab"), ("traceparent", None)],
])


@st.composite
def messages(draw):
    mid = draw(st.sampled_from(["a", "b", "c", ""]))
    headers = [("chronosMessageId", mid.encode()), ("chronosDeadline", str(draw(deadlines) // 1000).encode()),
               *draw(extras)]
    return FakeMessage(headers, key=draw(st.sampled_from([None, b"k"])), value=b"v-" + mid.encode(),
                       offset=draw(st.integers(0, 100)), partition=draw(st.integers(0, 7)))


@IMPLS
@settings(max_examples=300, deadline=None)
@given(batch=st.lists(messages(), max_size=12), rules=st.sampled_from([RULES, BOUNDED]))
def test_a_batch_is_sorted_as_decide_sorts_each_message(impl, batch, rules):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(consumer.codec, "intake", implementation(impl).intake)
        assert sort_batch(batch, NOW, rules) == one_by_one(batch, NOW, rules)


@IMPLS
def test_plain_messages_are_sorted_without_decide(impl, monkeypatch):
    """The lever: a poll of plain messages is stored and published without a Python decision each."""
    monkeypatch.setattr(consumer.codec, "intake", implementation(impl).intake)
    monkeypatch.setattr(consumer, "decide", lambda *a: pytest.fail("decide called for a plain message"))
    plain = [FakeMessage([("chronosMessageId", f"m{i}".encode()), ("chronosDeadline", str(d // 1000).encode()),
                          ("traceparent", b"00-ab")], offset=i)
             for i, d in enumerate([NOW + 10_000_000, NOW, NOW + 20_000_000])]
    batch = sort_batch(plain + [plain[0]], NOW, RULES)
    assert [r.id for r in batch.of(consumer.INSERT)] == ["m0", "m2"]
    assert [m for m, _ in batch.late] == [plain[1]] and batch.duplicates == 1
    assert batch.sources["m0"] is plain[0]
    row = batch.ops["m2"][1]
    assert (row.deadline_us, row.topic, row.key, row.value) == (NOW + 20_000_000, None, b"k", b"v")
    assert codec.decode_headers(row.headers) == [("traceparent", b"00-ab")]


@IMPLS
def test_each_stored_row_records_the_input_partition_it_was_read_from(impl, monkeypatch):
    """A plain message (intake) and one that is not (an ordering key, a schedule, a replace: `_sort_one`) alike:
    the row says which partition of the input topic it came from, so that a move of that partition to another
    cell takes it along."""
    monkeypatch.setattr(consumer.codec, "intake", implementation(impl).intake)
    later = str(NOW // 1000 + 60_000).encode()

    def message(mid: str, partition: int, *extra) -> FakeMessage:
        return FakeMessage([("chronosMessageId", mid.encode()), ("chronosDeadline", later), *extra],
                           partition=partition)
    batch = sort_batch([message("plain", 5), message("keyed", 3, ("chronosOrderingKey", b"k")),
                        message("daily", 7, ("chronosCron", b"0 9 * * *")),
                        message("new", 2, ("chronosAction", b"replace"))], NOW, RULES)
    assert {mid: row.input_partition for mid, (_, row) in batch.ops.items()} == \
        {"plain": 5, "keyed": 3, "daily": 7, "new": 2}


@IMPLS
def test_a_message_that_is_not_plain_is_left_to_the_caller(impl):
    intake = implementation(impl).intake
    plain = FakeMessage([("chronosMessageId", b"p"), ("chronosDeadline", str(NOW // 1000 + 60_000).encode())])
    cancel = FakeMessage([("chronosMessageId", b"p"), ("chronosAction", b"cancel")])
    batch = Batch()
    assert intake([plain, cancel, plain], 0, NOW, 50_000, None, "out", batch, consumer.Row, consumer.INSERT) == \
        (1, (cancel.headers(), None))  # its headers as read: not read again
    assert list(batch.ops) == ["p"]
    assert intake([plain, cancel, plain], 2, NOW, 50_000, None, "out", batch, consumer.Row, consumer.INSERT) == \
        (3, None)
    assert batch.duplicates == 1


@IMPLS
def test_headers_that_cannot_be_read_are_read_once_and_their_error_handed_over(impl):
    class Unreadable:
        reads = 0

        def headers(self):
            Unreadable.reads += 1
            raise SystemError("<method 'headers'> returned a result with an exception set")

    msg = Unreadable()
    i, read = implementation(impl).intake([msg], 0, NOW, 50_000, None, "out", Batch(), consumer.Row, consumer.INSERT)
    assert i == 0 and isinstance(read, SystemError) and Unreadable.reads == 1
