"""The input partition chosen by the routing key, end to end: the client's messages, their cancels and an
ordering key's messages meet in one partition of a topic of several, and a cancel sent with another Kafka
key than its message's cancels it."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from chronos.adapters.kafka.admin import create_topics
from chronos.adapters.kafka.clients import PRODUCER_DEFAULTS
from chronos.client import Scheduler
from chronos.domain.routing import input_partition, partition_of
from helpers import EMBEDDED_KAFKA, Collector, wait_for


def read_partitions(bootstrap: str, topic: str, partitions: int, expected: int) -> list[tuple[int, dict, bytes]]:
    """(partition, headers, key or b"") of the first `expected` messages of `topic`, read from its start."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": "false", **EMBEDDED_KAFKA})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen: list[tuple[int, dict, bytes]] = []
    try:
        def more() -> bool:
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                if msg.error() is None:
                    seen.append((msg.partition(), dict(msg.headers() or []), msg.key() or b""))
            return len(seen) >= expected
        wait_for(more, 20, f"{expected} messages on {topic}", every=0)
    finally:
        consumer.close()
    return seen


def test_a_cancel_sent_with_another_key_meets_its_message_and_cancels_it(processes, broker, topics):
    for role in ("consumer", "firer", "detector"):
        processes.wait_for_log(processes.start(role), "starting: node")
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    with Scheduler(broker.bootstrap_servers, input_topic=topics["input"]) as s:
        # each cancelled at once, before the consumer could have stored it: only one read after its
        # message can cancel it
        cancelled = [s.send_later(f"key-{i}", b"cancelled", delay=2.0) for i in range(8)]
        for mid in cancelled:
            s.cancel(mid)
        ordered = [s.send_later(f"order-{i}", b"ordered", delay=2.0, ordering_key="invoice-9") for i in range(3)]
        s.cancel(ordered[1], ordering_key="invoice-9")
        kept = s.send_later(b"key-kept", b"kept", delay=2.0)
    sent = read_partitions(broker.bootstrap_servers, topics["input"], 4, 8 * 2 + 3 + 1 + 1)
    where: dict[str, set[int]] = {}
    for partition, headers, _ in sent:
        where.setdefault(headers["chronosMessageId"].decode(), set()).add(partition)
    assert all(where[mid] == {input_partition(mid, None, 4)} for mid in cancelled + [kept])
    assert {p for mid in ordered for p in where[mid]} == {input_partition("", "invoice-9", 4)}
    assert len({p for mid in cancelled for p in where[mid]}) > 1  # spread over the topic's partitions
    # the Kafka keys travel unchanged: the messages keep theirs, the cancels have none
    assert sorted(k for _, h, k in sent if h.get("chronosAction") == b"cancel") == [b""] * 9
    got = collect.until(lambda ms: len(ms) >= 3, timeout=30)
    collect.poll_for(1.0)
    collect.close()
    assert sorted((m.key, m.value) for m in got) == [(b"key-kept", b"kept"), (b"order-0", b"ordered"),
                                                     (b"order-2", b"ordered")]


def test_the_routing_hash_is_the_one_librdkafka_partitions_keys_by(broker):
    """Another producer that sets the routing key as its Kafka key reaches the partition the client chooses."""
    topic = f"route-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap_servers, {topic: 7})
    producer = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": broker.bootstrap_servers})
    keys = [f"message-{i}".encode() for i in range(40)]
    for key in keys:
        producer.produce(topic, b"", key)
    assert producer.flush(20) == 0
    landed = {key: partition for partition, _, key in read_partitions(broker.bootstrap_servers, topic, 7, 40)}
    assert landed == {key: partition_of(key, 7) for key in keys}
