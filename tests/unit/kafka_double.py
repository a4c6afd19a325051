"""A test double of the Kafka port (`chronos.ports.Publisher`) for unit tests of the roles' logic,
and the settings those tests run with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from confluent_kafka import KafkaError, KafkaException

from chronos import config
from chronos.adapters.kafka.clients import OutageLog
from chronos.errors import KafkaUnanswered

ENV = {"CHRONOS_DATABASE_URL": "postgresql://unused@127.0.0.1:1/unused",
       "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "CHRONOS_METRICS_PORT": "0"}


def settings(**env: str) -> config.Settings:
    """Settings from CHRONOS_* variables (these over the defaults); no service is reached."""
    return config.load(environ={**ENV, **env}, default_ready_file=False)


@dataclass
class Produced:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list | None


class FakePublisher:
    """Records every `produce()`; `poll()` and `flush()` report each delivery, acknowledged unless
    `refuse(topic, value)` returns a KafkaError, or not at all while `answering` is False (Kafka
    is away). `purge()` makes the next `poll()` report every pending publish as purged, answering
    or not."""

    def __init__(self, refuse: Callable[[str, bytes | None], KafkaError | None] | None = None):
        self.produced: list[Produced] = []
        self.pending: list[tuple[Produced, Callable[[Any, Any], None] | None]] = []
        self.purged: list[tuple[Produced, Callable[[Any, Any], None] | None]] = []
        self.refuse = refuse
        self.answering = True

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                on_delivery: Callable[[Any, Any], None] | None = None, headers: Any = None) -> None:
        message = Produced(topic, key, value, headers)
        self.produced.append(message)
        self.pending.append((message, on_delivery))

    def poll(self, timeout: float = -1) -> int:
        purged, self.purged = self.purged, []
        for _, on_delivery in purged:
            if on_delivery is not None:
                on_delivery(KafkaError(KafkaError._PURGE_QUEUE), None)
        if not self.answering:
            return len(purged)
        pending, self.pending = self.pending, []
        for message, on_delivery in pending:
            if on_delivery is not None:
                on_delivery(self.refuse(message.topic, message.value) if self.refuse else None, None)
        return len(pending)

    def send(self, topic: str, value: bytes | None, key: bytes | None, headers: list | None,
             on_delivery: Callable[[Any, Any], None]) -> None:
        self.produce(topic, value, key, on_delivery=on_delivery, headers=headers)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return len(self.pending)

    def answers(self, timeout: float = 1.0) -> bool:
        return self.answering

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.purged += self.pending
        self.pending = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> dict:
        """The cluster's metadata (none here) while `answering`; a timeout while Kafka is away."""
        if not self.answering:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Kafka is away"))
        return {}

    topic_partitions: dict[str, int] = {}  # what `partitions` says of each topic

    def partitions(self, topic: str, timeout: float = 10.0) -> int | None:
        if not self.answering:
            raise KafkaUnanswered("Kafka is away")
        return self.topic_partitions.get(topic)

    def factory(self) -> Callable[[], tuple["FakePublisher", OutageLog]]:
        """A `producers` argument of the roles that always hands out this publisher."""
        return lambda: (self, OutageLog("test producer"))


class FakePublishers:
    """A `producers` argument that hands out a new publisher each time, made by `make(n)` for the
    n-th one (0 first): a producer the broker refuses, then one it takes, say."""

    def __init__(self, make: Callable[[int], FakePublisher]):
        self.make = make
        self.made: list[FakePublisher] = []

    def __call__(self) -> tuple[FakePublisher, OutageLog]:
        self.made.append(self.make(len(self.made)))
        return self.made[-1], OutageLog("test producer")


class FakeMessage:
    """Stands in for confluent_kafka.Message."""

    def __init__(self, headers, key=b"k", value=b"v", offset=0, partition=0, topic="in"):
        self._h, self._k, self._v, self._o, self._p, self._t = headers, key, value, offset, partition, topic

    def headers(self): return self._h
    def key(self): return self._k
    def value(self): return self._v
    def offset(self): return self._o
    def partition(self): return self._p
    def topic(self): return self._t
    def error(self): return None
