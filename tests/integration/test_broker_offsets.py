"""The offset reader `chronos up` samples its embedded broker with: exact end offsets where the broker's
ListOffsets(latest) answers the last batch's base offset + 1, and a group's unread messages."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from chronos.adapters.kafka.admin import OffsetReader, create_topics
from helpers import EMBEDDED_KAFKA


def test_exact_end_offsets_and_unread_messages_of_a_group(broker):
    topic, other = f"in-{uuid.uuid4().hex[:8]}", f"out-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap_servers, {topic: 2, other: 1})
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50})
    for _batch in range(3):  # three batches of 10 on partition 0, of 4 on partition 1
        for _ in range(10):
            p.produce(topic, b"x", partition=0)
        for _ in range(4):
            p.produce(topic, b"y", partition=1)
        assert p.flush(10) == 0
    p.produce(other, b"z", partition=0)
    assert p.flush(10) == 0
    # the group read 12 messages of partition 0 and none of partition 1
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group, **EMBEDDED_KAFKA})
    c.commit(offsets=[TopicPartition(topic, 0, 12)], asynchronous=False)
    listed = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1]
    c.close()

    reader = OffsetReader(broker.bootstrap_servers, group, topic)
    try:
        offsets = reader.read()
    finally:
        reader.close()
    assert offsets.exact
    assert offsets.ends[(topic, 0)] == (0, 30) and offsets.ends[(topic, 1)] == (0, 12)
    assert offsets.ends[(other, 0)] == (0, 1)
    assert listed <= 30  # what a plain ListOffsets says (21, the last batch's base + 1, on the embedded broker)
    assert offsets.committed == {(topic, 0): 12}
    assert offsets.unread(topic) == 30 - 12 + 12
    assert offsets.messages >= 30 + 12 + 1  # other tests' topics on the same broker count too


def test_an_unreachable_broker_is_unavailable_not_a_crash():
    import pytest

    from chronos.embedded.procs import free_port
    from chronos.errors import UnavailableError
    reader = OffsetReader(f"127.0.0.1:{free_port()}", "g", "t", timeout=0.5)
    try:
        with pytest.raises(UnavailableError):
            reader.read()
    finally:
        reader.close()
