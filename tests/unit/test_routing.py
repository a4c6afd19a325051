"""The routing of a message to its input partition (chronos.domain.routing), and the client's use of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chronos.client import Scheduler
from chronos.domain.routing import input_partition, murmur2, partition_of, routing_key

# Kafka's own test of the Java client's Utils.murmur2 (clients/src/test/.../utils/UtilsTest.java)
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data,expected", JAVA_MURMUR2.items())
def test_murmur2_is_the_java_clients(data, expected):
    assert murmur2(data) == expected


def test_the_partition_is_the_positive_hash_modulo_the_partition_count():
    # Utils.toPositive(murmur2(key)) % numPartitions
    assert partition_of(b"21", 12) == (-973932308 & 0x7FFFFFFF) % 12 == 0
    assert partition_of(b"foobar", 12) == (-790332482 & 0x7FFFFFFF) % 12
    assert partition_of(b"abc", 7) == 479470107 % 7
    assert {partition_of(b"any key", 1)} == {0}
    with pytest.raises(ValueError):
        partition_of(b"k", 0)


def test_a_message_routes_by_its_ordering_key_else_its_id():
    assert routing_key("order-7", None) == b"order-7"
    assert routing_key("order-7", "invoice-9") == b"invoice-9"
    assert routing_key("id-é", None) == "id-é".encode()
    # one ordering key's messages meet in one partition, whatever their ids
    assert len({input_partition(f"msg-{i}", "invoice-9", 16) for i in range(50)}) == 1
    # without one, ids spread over the partitions
    assert len({input_partition(f"msg-{i}", None, 16) for i in range(200)}) == 16


class RecordingProducer:
    """What the client asks of its producer: the input topic's metadata, and produce() with a partition."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self.produced: list[SimpleNamespace] = []
        self.metadata_asked = 0

    def list_topics(self, topic: str, timeout: float):
        self.metadata_asked += 1
        meta = SimpleNamespace(error=None, partitions={p: None for p in range(self.partitions)})
        return SimpleNamespace(topics={topic: meta})

    def produce(self, topic, value, key, *, partition, headers, on_delivery):
        self.produced.append(SimpleNamespace(topic=topic, key=key, value=value, partition=partition,
                                             headers=dict(headers)))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


def test_the_client_sends_a_message_its_cancel_and_its_replace_to_one_partition_keeping_each_kafka_key():
    producer = RecordingProducer(partitions=12)
    s = Scheduler(producer=producer, input_topic="in")
    mid = s.send_later(b"order-7", b"expire", delay=60)
    s.replace(b"another-key", b"expire later", delay=120, message_id=mid)
    s.cancel(mid)
    ordered = [s.send_later(f"k{i}", b"v", delay=60, ordering_key="invoice-9") for i in range(5)]
    s.cancel(ordered[0], ordering_key="invoice-9")
    sent = producer.produced
    assert [m.partition for m in sent[:3]] == [input_partition(mid, None, 12)] * 3
    assert [m.key for m in sent[:3]] == [b"order-7", b"another-key", None]
    assert {m.partition for m in sent[3:]} == {input_partition("any id", "invoice-9", 12)}
    assert [m.key for m in sent[3:8]] == [f"k{i}".encode() for i in range(5)]
    assert sent[-1].headers == {"chronosMessageId": ordered[0].encode(), "chronosAction": b"cancel",
                                "chronosOrderingKey": b"invoice-9"}
    assert producer.metadata_asked == 1  # the partition count is asked once


def test_an_ordering_key_given_as_a_header_routes_too():
    producer = RecordingProducer(partitions=8)
    s = Scheduler(producer=producer, input_topic="in")
    s.send_later(b"k", b"v", delay=60, headers=[("chronosOrderingKey", b"invoice-9")])
    assert producer.produced[0].partition == input_partition("x", "invoice-9", 8)


def test_the_client_says_when_the_input_topic_is_missing():
    class Missing(RecordingProducer):
        def list_topics(self, topic: str, timeout: float):
            error = SimpleNamespace(str=lambda: "Broker: Unknown topic or partition")
            return SimpleNamespace(topics={topic: SimpleNamespace(error=error, partitions={})})

    with pytest.raises(RuntimeError, match="input topic in: Broker: Unknown topic"):
        Scheduler(producer=Missing(1), input_topic="in").send_later(b"k", b"v", delay=1)
