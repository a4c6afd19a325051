"""The Kafka ports' contract: every test runs against confluent-kafka on the embedded broker
(tests/conftest.py) and against the in-memory twin (`chronos.adapters.kafka.memory`), through the
ports only (`Publisher`, `InputConsumer`, `GroupWatcher`) and `Cluster`'s way of making clients."""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import pytest

from chronos import ports
from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS, GroupConsumer, Producer
from chronos.adapters.kafka.memory import MemoryConsumer, MemoryKafka, MemoryProducer, MemoryWatcher
from chronos.domain.delivery import PERMANENT_FAILURE, UNANSWERED_FAILURE, classify

TIMEOUT = 30.0


class Cluster:
    """A Kafka with fresh topics of `partitions` partitions each; clients made on it are closed at the end."""

    name: str

    def producer(self) -> ports.Publisher:
        raise NotImplementedError

    def consumer(self) -> ports.InputConsumer:
        raise NotImplementedError

    def watcher(self) -> ports.GroupWatcher:
        raise NotImplementedError

    def topic(self, partitions: int = 2) -> str:
        raise NotImplementedError


class BrokerCluster(Cluster):
    name = "broker"

    def __init__(self, bootstrap: str):
        self.bootstrap, self.group = bootstrap, f"g-{uuid.uuid4().hex[:8]}"
        self.made: list[Any] = []

    def producer(self) -> ports.Publisher:
        return Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})

    def _consumer(self) -> GroupConsumer:
        made = GroupConsumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "enable.auto.commit": False,
                              "auto.offset.reset": "earliest", **EMBEDDED_GROUP_TIMEOUTS})
        self.made.append(made)
        return made

    def consumer(self) -> ports.InputConsumer:
        return self._consumer()

    def watcher(self) -> ports.GroupWatcher:
        return self._consumer()

    def topic(self, partitions: int = 2) -> str:
        from chronos.adapters.kafka.admin import create_topics
        name = f"k-{uuid.uuid4().hex[:8]}"
        create_topics(self.bootstrap, {name: partitions})
        return name

    def close(self) -> None:
        for client in self.made:
            client.close()


class MemoryCluster(Cluster):
    name = "memory"

    def __init__(self) -> None:
        self.kafka = MemoryKafka()

    def producer(self) -> ports.Publisher:
        return MemoryProducer(self.kafka)

    def consumer(self) -> ports.InputConsumer:
        return MemoryConsumer(self.kafka)

    def watcher(self) -> ports.GroupWatcher:
        return MemoryWatcher(self.kafka)

    def topic(self, partitions: int = 2) -> str:
        name = f"k-{uuid.uuid4().hex[:8]}"
        self.kafka.create_topic(name, partitions)
        return name

    def close(self) -> None:
        pass


@pytest.fixture(params=["broker", "memory"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    made: BrokerCluster | MemoryCluster
    if request.param == "broker":
        made = BrokerCluster(request.getfixturevalue("broker").bootstrap_servers)
    else:
        made = MemoryCluster()
    yield made
    made.close()


def publish(producer: ports.Publisher, topic: str, messages: list[tuple[bytes, bytes, list]]) -> list[Any]:
    """Send each (key, value, headers) and wait for every delivery report: the errors, in order."""
    reports: list[Any] = [()] * len(messages)
    for i, (key, value, headers) in enumerate(messages):
        producer.send(topic, value, key, headers, lambda err, _msg, i=i: reports.__setitem__(i, (err,)))
    deadline = time.monotonic() + TIMEOUT
    while producer.flush(1.0) > 0 or any(r == () for r in reports):
        assert time.monotonic() < deadline, "delivery reports never came"
    return [r[0] for r in reports]


def read(consumer: ports.InputConsumer, count: int) -> list[Any]:
    """Consume until `count` messages were read (a real group's first join takes a moment)."""
    got: list[Any] = []
    deadline = time.monotonic() + TIMEOUT
    while len(got) < count:
        assert time.monotonic() < deadline, f"read {len(got)} of {count} messages"
        got += [m for m in consumer.consume(num_messages=count - len(got), timeout=0.2) if m.error() is None]
    return got


def test_what_is_published_is_acknowledged_and_read_back_as_sent(cluster):
    topic = cluster.topic()
    sent = [(b"k", b"v%d" % i, [("h", b"x"), ("h", None)]) for i in range(3)]
    assert publish(cluster.producer(), topic, sent) == [None, None, None]
    consumer = cluster.consumer()
    consumer.subscribe([topic], on_lost=lambda *_: None)
    got = read(consumer, 3)
    # one key, one partition: in the order sent, offsets counting from 0
    assert [(m.key(), m.value(), list(m.headers())) for m in got] == [(k, v, h) for k, v, h in sent]
    assert [m.offset() for m in got] == [0, 1, 2] and {m.topic() for m in got} == {topic}


def test_a_message_too_large_is_refused_for_good_through_its_delivery_report(cluster):
    [err] = publish(cluster.producer(), cluster.topic(), [(b"k", b"x" * 1_500_000, [])])
    assert err is not None and classify(err) == PERMANENT_FAILURE


def test_a_purged_publish_is_reported_unanswered(cluster):
    producer, topic, reports = cluster.producer(), cluster.topic(), []
    producer.send(topic, b"v", b"k", None, lambda err, _msg: reports.append(err))
    producer.purge(in_queue=True, in_flight=True, blocking=False)
    producer.flush(5.0)
    assert len(reports) == 1 and classify(reports[0]) == UNANSWERED_FAILURE


def test_a_new_member_reads_from_what_the_group_committed_and_a_watcher_sees_it(cluster):
    topic = cluster.topic(partitions=1)
    publish(cluster.producer(), topic, [(b"k", b"v%d" % i, []) for i in range(4)])
    first = cluster.consumer()
    first.subscribe([topic], on_lost=lambda *_: None)
    got = read(first, 2)
    first.commit_offsets({(topic, 0): got[1].offset() + 1}, wait=True)
    first.close()
    assert cluster.watcher().group_progress(topic, 10.0) == {0: 2}
    second = cluster.consumer()
    second.subscribe([topic], on_lost=lambda *_: None)
    assert [m.value() for m in read(second, 2)] == [b"v2", b"v3"]
    assert second.ends() == {0: (4, 4)}


def test_the_cluster_answers_and_a_watcher_sees_no_commit_on_a_new_topic(cluster):
    topic = cluster.topic(partitions=2)
    assert cluster.producer().answers(5.0)
    assert cluster.watcher().group_progress(topic, 10.0) == {0: -1001, 1: -1001}


def test_a_paused_partition_is_not_read_until_resumed_and_a_seek_reads_it_again(cluster):
    topic = cluster.topic(partitions=1)
    publish(cluster.producer(), topic, [(b"k", b"v%d" % i, []) for i in range(4)])
    consumer = cluster.consumer()
    consumer.subscribe([topic], on_lost=lambda *_: None)
    assert [m.offset() for m in read(consumer, 4)] == [0, 1, 2, 3]
    consumer.pause_partitions([(topic, 0)])
    consumer.seek_partitions({(topic, 0): 1})
    publish(cluster.producer(), topic, [(b"k", b"v4", [])])
    for _ in range(5):  # a second of polls: nothing of a paused partition
        assert [m for m in consumer.consume(num_messages=10, timeout=0.2) if m.error() is None] == []
    consumer.resume_partitions([(topic, 0)])
    assert [m.value() for m in read(consumer, 4)] == [b"v1", b"v2", b"v3", b"v4"]
    consumer.close()


def test_a_paused_partition_stays_paused_through_leaving_the_group_and_joining_it_again_until_resumed(cluster):
    topic = cluster.topic(partitions=1)
    publish(cluster.producer(), topic, [(b"k", b"v0", [])])
    consumer = cluster.consumer()
    consumer.subscribe([topic], on_lost=lambda *_: None)
    assert [m.value() for m in read(consumer, 1)] == [b"v0"]
    consumer.pause_partitions([(topic, 0)])
    consumer.unsubscribe()
    consumer.subscribe([topic], on_lost=lambda *_: None)
    publish(cluster.producer(), topic, [(b"k", b"v1", [])])
    deadline = time.monotonic() + TIMEOUT
    while 0 not in consumer.ends():  # the partition assigned back
        assert time.monotonic() < deadline, "never assigned back"
        assert [m for m in consumer.consume(num_messages=10, timeout=0.2) if m.error() is None] == []
    for _ in range(5):  # a second of polls more: still paused
        assert [m for m in consumer.consume(num_messages=10, timeout=0.2) if m.error() is None] == []
    consumer.resume_partitions([(topic, 0)])
    assert [m.value() for m in read(consumer, 2)] == [b"v0", b"v1"]  # nothing committed: from the start
    consumer.close()
